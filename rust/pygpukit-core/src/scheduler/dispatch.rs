//! Dispatch: which admitted task may start now, by tenant share and QoS, and
//! whether best-effort work would delay Guaranteed work it cannot yield to.

use std::cell::OnceCell;
use std::collections::BTreeMap;

use super::reservations::Fit;
use super::task::Task;
use super::tenant::Forecast;
use super::{
    check_time, Admission, Pace, Qos, SchedError, Scheduler, Submitted, TaskId, TaskSpec, TaskState,
};

/// Waiting tasks counted by what they mean for another tenant's task.
#[derive(Clone, Copy, Default)]
struct Counts {
    /// Guaranteed tasks of tenants within their share.
    guaranteed_within: usize,
    /// Tasks of tenants within their share.
    within: usize,
    /// Guaranteed and Burstable tasks.
    not_best_effort: usize,
    /// Guaranteed and Burstable tasks of tenants within their share.
    within_not_best_effort: usize,
}

impl Counts {
    fn add(&mut self, qos: Qos, within: bool) {
        self.guaranteed_within += usize::from(within && qos == Qos::Guaranteed);
        self.within += usize::from(within);
        self.not_best_effort += usize::from(qos != Qos::BestEffort);
        self.within_not_best_effort += usize::from(within && qos != Qos::BestEffort);
    }

    fn minus(self, o: Counts) -> Counts {
        Counts {
            guaranteed_within: self.guaranteed_within - o.guaranteed_within,
            within: self.within - o.within,
            not_best_effort: self.not_best_effort - o.not_best_effort,
            within_not_best_effort: self.within_not_best_effort - o.within_not_best_effort,
        }
    }
}

/// The waiting set summed up once per decision, so that pacing every waiting
/// task costs O(n log t) rather than each task scanning all the others.
struct View<'a> {
    now: f64,
    total: Counts,
    /// Per tenant with waiting tasks: whether it is within share, its counts.
    tenants: BTreeMap<&'a str, (bool, Counts)>,
    /// The Guaranteed tenants' forecasts, made once per decision when a
    /// best-effort task's hold asks for them (not once per such task).
    forecasts: OnceCell<Vec<Forecast>>,
}

/// Why a task may not start now.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Hold {
    /// Its tenant is over its share, or others are within theirs first.
    Share(Option<f64>),
    /// Best-effort work that could still be on the GPU when Guaranteed work
    /// needs it.
    ForGuaranteed(Option<f64>),
    /// Best effort behind the one best-effort launch in flight (not counted:
    /// every backlogged task would be).
    BehindBestEffort,
    /// Best effort over the best-effort duty limit, until its bucket refills.
    Duty(Option<f64>),
}

impl Scheduler {
    fn view(&self, now: f64) -> View<'_> {
        let mut v = View {
            now,
            total: Counts::default(),
            tenants: BTreeMap::new(),
            forecasts: OnceCell::new(),
        };
        for k in &self.waiting {
            let spec = &self.tasks[&k.id].spec;
            let e = v.tenants.entry(spec.tenant.as_str()).or_insert_with(|| {
                let within = self.tenants[&spec.tenant].bucket.within_share(now);
                (within, Counts::default())
            });
            e.1.add(spec.qos, e.0);
            v.total.add(spec.qos, e.0);
        }
        v
    }

    /// Best-effort work starts only if it cannot delay Guaranteed work: a
    /// launch on the GPU cannot be preempted (large GEMM kernels hold every SM
    /// until they end, whatever the stream priorities), so it is held while a
    /// Guaranteed task waits or runs, while another best-effort launch is in
    /// flight, and while a Guaranteed tenant's next arrival (from its recent
    /// gaps) is due before this launch would end (its tenant's longest recent
    /// launch plus the guard). Returns when the hold lapses by itself: the
    /// last such tenant going idle; None when only another event can lift it.
    fn guaranteed_hold(&self, v: &View<'_>, task: &Task) -> Option<Hold> {
        let now = v.now;
        if task.spec.qos != Qos::BestEffort {
            return None;
        }
        let g_waiting = self
            .waiting
            .first()
            .is_some_and(|k| k.qos == Qos::Guaranteed);
        if g_waiting || self.running[Qos::Guaranteed as usize] > 0 {
            return Some(Hold::ForGuaranteed(None));
        }
        if self.running[Qos::BestEffort as usize] > 0 {
            return Some(Hold::BehindBestEffort);
        }
        if let Some(b) = self.best_effort.as_ref().filter(|b| !b.within_share(now)) {
            return Some(Hold::Duty(b.ready_at(now)));
        }
        let ends = now + self.tenants[&task.spec.tenant].expected_ms().unwrap_or(0.0);
        self.forecasts(v)
            .iter()
            .filter(|f| now < f.idle_at_ms && ends + self.guard_ms > f.next_ms)
            .map(|f| f.idle_at_ms)
            .reduce(f64::max)
            .map(|t| Hold::ForGuaranteed(Some(t)))
    }

    /// When the last Guaranteed tenant with a forecast goes idle (None: no
    /// tenant has shown a rate yet).
    fn guaranteed_idle_at(&self, v: &View<'_>) -> Option<f64> {
        self.forecasts(v)
            .iter()
            .map(|f| f.idle_at_ms)
            .reduce(f64::max)
    }

    /// The tenants' forecasts (those that have shown a rate), once per view.
    fn forecasts<'v>(&self, v: &'v View<'_>) -> &'v [Forecast] {
        v.forecasts.get_or_init(|| {
            self.tenants
                .values()
                .filter_map(|t| t.forecast(self.min_idle_ms))
                .collect()
        })
    }

    /// Pacing by share. A tenant within its share may start, except that a
    /// waiting Guaranteed tenant within its share goes first. A tenant over
    /// its share only borrows time no one else is entitled to: it waits while
    /// another tenant within share has a task waiting, and BestEffort also
    /// waits while any Guaranteed or Burstable task of another tenant waits;
    /// a Guaranteed task over its share does not wait for best-effort work.
    fn hold(&self, v: &View<'_>, task: &Task) -> Option<Hold> {
        if let Some(h) = self.guaranteed_hold(v, task) {
            return Some(h);
        }
        let spec = &task.spec;
        let bucket = &self.tenants[&spec.tenant].bucket;
        let mine = bucket.within_share(v.now);
        let own = v
            .tenants
            .get(spec.tenant.as_str())
            .map_or(Counts::default(), |e| e.1);
        let others = v.total.minus(own);
        let contended = if mine {
            spec.qos != Qos::Guaranteed && others.guaranteed_within > 0
        } else if spec.qos == Qos::Guaranteed {
            // While this task waits, best-effort work is held for it: counting
            // it as a contender would leave the GPU idle with both held.
            others.within_not_best_effort > 0
        } else {
            others.within > 0 || (spec.qos == Qos::BestEffort && others.not_best_effort > 0)
        };
        match (contended, mine) {
            (false, _) => None,
            (true, true) => Some(Hold::Share(None)),
            (true, false) => Some(Hold::Share(bucket.ready_at(v.now))),
        }
    }

    fn pace_in(&self, v: &View<'_>, task: &Task) -> Pace {
        match self.hold(v, task) {
            None => Pace::Start,
            Some(Hold::Share(until) | Hold::ForGuaranteed(until) | Hold::Duty(until)) => {
                Pace::Wait { until }
            }
            Some(Hold::BehindBestEffort) => Pace::Wait { until: None },
        }
    }

    /// Whether pacing lets an admitted task start at `now` (see `hold` and
    /// `guaranteed_hold` for the rules).
    pub fn pace(&self, id: TaskId, now: f64) -> Result<Pace, SchedError> {
        check_time(now)?;
        let task = self.expect_state(id, &[TaskState::Admitted], "pace")?;
        Ok(self.pace_in(&self.view(now), task))
    }

    /// `pace`, counting the task as throttled the first time it is held back.
    pub fn may_start(&mut self, id: TaskId, now: f64) -> Result<bool, SchedError> {
        check_time(now)?;
        let task = self.expect_state(id, &[TaskState::Admitted], "pace")?;
        let hold = self.hold(&self.view(now), task);
        if let Some(h) = hold {
            self.note_hold(id, h);
        }
        Ok(hold.is_none())
    }

    /// When the task may start: `now` if it may, the time its tenant is back
    /// within share, or None when that depends on other tasks only.
    pub fn next_start_time(&self, id: TaskId, now: f64) -> Result<Option<f64>, SchedError> {
        Ok(match self.pace(id, now)? {
            Pace::Start => Some(now),
            Pace::Wait { until } => until,
        })
    }

    /// The earliest time after `now` at which a waiting task could start
    /// without any other event (a bucket refilling, a Guaranteed tenant going
    /// idle); None if only events can. Held tasks are counted as throttled or
    /// held, once each. Best effort held while Guaranteed work waits or runs
    /// counts from the Guaranteed tenants' idle time as forecast now: that
    /// work ending is an event, but the hold then lapses no earlier than that
    /// unless the forecast lets it start at once (which the end's caller
    /// checks). A dispatcher that sleeps until then is not woken at every
    /// Guaranteed step to learn it.
    pub fn next_wakeup(&mut self, now: f64) -> Result<Option<f64>, SchedError> {
        check_time(now)?;
        Ok(self.wakeup_or_ready(now, false).unwrap_or(None))
    }

    /// After a task's end: whether a waiting task may start now (`pick_next`
    /// finds one), else `next_wakeup`, in one pass over the waiting tasks
    /// (the same holds counted: none when one may start). Ok(true, None): one
    /// may start; Ok(false, wake): none may, `next_wakeup`'s answer.
    pub fn ready_or_wakeup(&mut self, now: f64) -> Result<(bool, Option<f64>), SchedError> {
        check_time(now)?;
        Ok(match self.wakeup_or_ready(now, true) {
            Some(wake) => (false, wake),
            None => (true, None),
        })
    }

    /// `next_wakeup`'s pass; with `stop_if_ready`, None (and nothing counted)
    /// as soon as a waiting task is not held.
    fn wakeup_or_ready(&mut self, now: f64, stop_if_ready: bool) -> Option<Option<f64>> {
        let mut wake: Option<f64> = None;
        let mut held = Vec::new();
        {
            let v = self.view(now);
            for k in &self.waiting {
                let Some(h) = self.hold(&v, &self.tasks[&k.id]) else {
                    if stop_if_ready {
                        return None;
                    }
                    continue;
                };
                held.push((k.id, h));
                let at = match h {
                    Hold::Share(t) | Hold::Duty(t) => t,
                    Hold::ForGuaranteed(Some(t)) => Some(t),
                    Hold::ForGuaranteed(None) => self.guaranteed_idle_at(&v),
                    Hold::BehindBestEffort => None,
                };
                if let Some(t) = at.filter(|&t| t > now) {
                    wake = Some(wake.map_or(t, |w: f64| w.min(t)));
                }
            }
        }
        for (id, h) in held {
            self.note_hold(id, h);
        }
        Some(wake)
    }

    fn note_hold(&mut self, id: TaskId, hold: Hold) {
        let task = self.tasks.get_mut(&id).expect("paced task");
        let tenant = self.tenants.get_mut(&task.spec.tenant).expect("tenant");
        match hold {
            Hold::Share(_) if !task.throttled => {
                task.throttled = true;
                self.counts.throttled += 1;
                tenant.throttled_tasks += 1;
            }
            Hold::ForGuaranteed(_) if !task.held => {
                task.held = true;
                self.counts.held_for_guaranteed += 1;
                tenant.held_tasks += 1;
            }
            Hold::Duty(_) if !task.duty_held => {
                task.duty_held = true;
                self.counts.held_for_duty += 1;
            }
            _ => {}
        }
    }

    /// The admitted task to start next, if any may start: tasks within their
    /// tenant's share before borrowers, then by QoS, then the tenant least
    /// overdrawn relative to its share (weighted fairness), then admission
    /// order. One pass over the waiting tasks.
    pub fn pick_next(&self, now: f64) -> Result<Option<TaskId>, SchedError> {
        check_time(now)?;
        let v = self.view(now);
        let mut best: Option<((bool, Qos, f64), TaskId)> = None;
        // `waiting` iterates in admission order, so the first of equal rank wins.
        for key in &self.waiting {
            let task = &self.tasks[&key.id];
            if self.hold(&v, task).is_some() {
                continue;
            }
            let (within, _) = v.tenants[task.spec.tenant.as_str()];
            let bucket = &self.tenants[&task.spec.tenant].bucket;
            let credit = if bucket.rate() > 0.0 {
                bucket.tokens_at(now) / bucket.rate()
            } else {
                f64::NEG_INFINITY
            };
            let rank = (!within, task.spec.qos, -credit);
            let better = match &best {
                None => true,
                Some((b, _)) => (rank.0, rank.1)
                    .cmp(&(b.0, b.1))
                    .then(rank.2.total_cmp(&b.2))
                    .is_lt(),
            };
            if better {
                best = Some((rank, key.id));
            }
        }
        Ok(best.map(|(_, id)| id))
    }

    /// Picks the next task and starts it; the tasks still held back count as
    /// throttled (or held for Guaranteed work). Returns the task and the
    /// stream priority of its partition.
    pub fn pick_and_start(&mut self, now: f64) -> Result<Option<(TaskId, i32)>, SchedError> {
        let Some(id) = self.pick_next(now)? else {
            self.next_wakeup(now)?;
            return Ok(None);
        };
        let prio = self.begin(id, now); // pick_next found it may start now
        self.next_wakeup(now)?;
        Ok(Some((id, prio)))
    }

    /// Submits a task and, when `start` (the caller may launch now) and the
    /// task is the one `pick_and_start` would start, starts it in the same
    /// step: the common case of a submission that runs at once costs one call.
    /// Returns the submission and the stream priority of the started task;
    /// None when it did not start here (queued, rejected, admitted others
    /// with it, or pacing picks another task or none: the caller then picks
    /// as usual).
    pub fn submit_and_start(
        &mut self,
        spec: TaskSpec,
        now: f64,
        start: bool,
    ) -> Result<(Submitted, Option<i32>), SchedError> {
        let s = self.submit(spec, now)?;
        if !start || s.admission != Admission::Admitted || !s.also_admitted.is_empty() {
            return Ok((s, None));
        }
        if self.pick_next(now)? != Some(s.id) {
            return Ok((s, None));
        }
        let prio = self.begin(s.id, now); // pick_next found it may start now
        self.next_wakeup(now)?;
        Ok((s, Some(prio)))
    }

    /// `submit_and_start` for a Guaranteed task only when it certainly starts
    /// now, else None having changed nothing (the caller then submits as
    /// usual): nothing waits for memory (so the submission admits no other
    /// task), every waiting task is best effort (held while this one runs, so
    /// pacing picks this one whatever its tenant's tokens), the task is not
    /// refused and its reservation fits its partition and the node. A native
    /// caller uses it to commit to the launch before it builds anything.
    /// Returns the task and its partition's stream priority.
    pub fn submit_start_now(
        &mut self,
        spec: TaskSpec,
        now: f64,
    ) -> Result<Option<(TaskId, i32)>, SchedError> {
        if spec.qos != Qos::Guaranteed
            || !self.queue.is_empty()
            || self.waiting.iter().any(|k| k.qos != Qos::BestEffort)
            || self.refusal(&spec).is_some()
        {
            return Ok(None);
        }
        let part = &self.partitions[&spec.partition]; // refusal found it
        if self
            .res
            .fits(&part.name, part.memory_quota_bytes, spec.reservation_bytes)
            != Fit::Yes
        {
            return Ok(None);
        }
        // submit_and_start's pick and hold count, known here: every waiting task
        // is best effort, so the Guaranteed task goes first (a waiting Guaranteed
        // task holds best effort, and this one's own hold is None: no tenant
        // within its share waits but best effort), and once it runs each waiting
        // task is held for it (what next_wakeup would count).
        let s = self.submit(spec, now)?;
        match s.admission {
            Admission::Admitted if s.also_admitted.is_empty() => {
                debug_assert!(matches!(self.pick_next(now), Ok(Some(id)) if id == s.id));
                let prio = self.begin(s.id, now);
                let held: Vec<TaskId> = self.waiting.iter().map(|k| k.id).collect();
                for id in held {
                    self.note_hold(id, Hold::ForGuaranteed(None));
                }
                Ok(Some((s.id, prio)))
            }
            _ => Err(SchedError::InvalidTransition {
                id: s.id,
                from: "submitted",
                action: "start at submission (submit_start_now's conditions were not enough)",
            }),
        }
    }
}
