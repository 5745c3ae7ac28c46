//! Per-tenant pacing state and accounting, and what the tenant's past says
//! about its next launch: when its next Guaranteed task will arrive and how
//! long its launches take.

use std::collections::VecDeque;

use super::pacing::Bucket;

/// Recent gaps and durations kept per tenant: enough to follow a change of
/// rate within a few launches, few enough that one outlier soon ages out.
pub const HISTORY: usize = 16;

/// A Guaranteed tenant silent for this many of its longest recent gaps (and
/// at least the scheduler's `min_idle_ms`) is idle: holding best-effort work
/// back for it would only waste the GPU.
pub const IDLE_GAPS: f64 = 2.0;

/// When the next Guaranteed arrival of a tenant is due, from its history.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Forecast {
    /// Earliest expected arrival: the last one plus the shortest recent gap.
    pub next_ms: f64,
    /// From then on the tenant counts as idle.
    pub idle_at_ms: f64,
}

#[derive(Clone, Debug)]
pub struct Tenant {
    pub bucket: Bucket,
    pub gpu_time_ms: f64,
    pub live_tasks: usize,
    /// Live Guaranteed tasks: while any exist the tenant's share counts
    /// against the guaranteed bandwidth of the node.
    pub guaranteed_live: usize,
    pub completed: u64,
    pub failed: u64,
    pub throttled_tasks: u64,
    /// Best-effort tasks held back to keep the GPU clear for Guaranteed work.
    pub held_tasks: u64,
    last_guaranteed_ms: Option<f64>,
    guaranteed_gaps: VecDeque<f64>,
    durations: VecDeque<f64>,
}

fn push(v: &mut VecDeque<f64>, x: f64) {
    if v.len() == HISTORY {
        v.pop_front();
    }
    v.push_back(x);
}

impl Tenant {
    pub fn new(share: f64, burst_ms: f64, now: f64) -> Self {
        Self {
            bucket: Bucket::new(share, burst_ms, now),
            gpu_time_ms: 0.0,
            live_tasks: 0,
            guaranteed_live: 0,
            completed: 0,
            failed: 0,
            throttled_tasks: 0,
            held_tasks: 0,
            last_guaranteed_ms: None,
            guaranteed_gaps: VecDeque::new(),
            durations: VecDeque::new(),
        }
    }

    /// Records a Guaranteed submission at `now`.
    pub fn note_guaranteed_arrival(&mut self, now: f64, min_idle_ms: f64) {
        if let Some(last) = self.last_guaranteed_ms {
            // A gap across an idle spell says nothing about the arrival rate;
            // recording it would hold best-effort work back for as long.
            let idle = self
                .forecast(min_idle_ms)
                .is_some_and(|f| now >= f.idle_at_ms);
            if now >= last && !idle {
                push(&mut self.guaranteed_gaps, now - last);
            }
        }
        self.last_guaranteed_ms = Some(self.last_guaranteed_ms.map_or(now, |l| l.max(now)));
    }

    /// Records the measured GPU time of one of its launches.
    pub fn note_duration(&mut self, gpu_ms: f64) {
        push(&mut self.durations, gpu_ms);
    }

    /// None until two Guaranteed arrivals have shown a rate.
    pub fn forecast(&self, min_idle_ms: f64) -> Option<Forecast> {
        let last = self.last_guaranteed_ms?;
        let min = self.guaranteed_gaps.iter().copied().reduce(f64::min)?;
        let max = self.guaranteed_gaps.iter().copied().reduce(f64::max)?;
        Some(Forecast {
            next_ms: last + min,
            idle_at_ms: last + (IDLE_GAPS * max).max(min_idle_ms),
        })
    }

    /// The longest recent launch: a launch cannot be taken back once on the
    /// GPU, so the estimate errs long.
    pub fn expected_ms(&self) -> Option<f64> {
        self.durations.iter().copied().reduce(f64::max)
    }

    pub fn shortest_gap_ms(&self) -> Option<f64> {
        self.guaranteed_gaps.iter().copied().reduce(f64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forecast_from_gaps_skips_idle_spells() {
        let mut t = Tenant::new(0.5, 10.0, 0.0);
        t.note_guaranteed_arrival(0.0, 0.0);
        assert_eq!(t.forecast(0.0), None, "one arrival shows no rate");
        t.note_guaranteed_arrival(4.0, 0.0);
        t.note_guaranteed_arrival(7.0, 0.0);
        let f = t.forecast(0.0).unwrap();
        assert_eq!((f.next_ms, f.idle_at_ms), (10.0, 15.0));
        assert_eq!(t.forecast(20.0).unwrap().idle_at_ms, 27.0, "idle floor");
        // Silent past 15: the 93 ms gap is an idle spell, not a rate.
        t.note_guaranteed_arrival(100.0, 0.0);
        assert_eq!(t.shortest_gap_ms(), Some(3.0));
        assert_eq!(t.forecast(0.0).unwrap().idle_at_ms, 108.0);
        for k in 0..HISTORY {
            t.note_duration(k as f64);
        }
        t.note_duration(1.0);
        assert_eq!(t.expected_ms(), Some((HISTORY - 1) as f64));
        for _ in 0..HISTORY {
            t.note_duration(1.0);
        }
        assert_eq!(t.expected_ms(), Some(1.0), "old outliers age out");
    }
}
