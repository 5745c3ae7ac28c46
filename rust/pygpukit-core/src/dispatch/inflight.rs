//! Completion tracking and an in-flight bound per stream.
//!
//! Every `every` launches on a stream an event (a marker) is recorded after
//! them. At most `max_markers` markers are outstanding per stream: recording
//! one more first waits for the oldest, so the host never runs further ahead
//! of the device than `every * max_markers` launches. Markers that have
//! completed are popped (their launches counted complete) and their events
//! reused.

use std::collections::{HashMap, VecDeque};

use super::controller::Launcher;
use super::error::DispatchError;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlightStats {
    /// Launches handed to the driver.
    pub issued: u64,
    /// Launches known to have finished (their marker completed).
    pub completed: u64,
    /// Markers outstanding now, over all streams.
    pub markers: usize,
    /// Times the host waited for the oldest marker (the bound was reached).
    pub waits: u64,
}

struct StreamState<E> {
    markers: VecDeque<(E, u64)>, // event, launches it covers
    unmarked: u64,               // launches since the last marker
}

pub struct InFlight<E> {
    every: u64,
    max_markers: usize,
    streams: HashMap<u64, StreamState<E>>,
    spare: Vec<E>,
    stats: InFlightStats,
}

impl<E> InFlight<E> {
    pub fn new(every: u64, max_markers: usize) -> Self {
        Self {
            every: every.max(1),
            max_markers: max_markers.max(1),
            streams: HashMap::new(),
            spare: Vec::new(),
            stats: InFlightStats::default(),
        }
    }

    pub fn stats(&self) -> InFlightStats {
        self.stats
    }

    /// The most launches on one stream that can be queued and not known
    /// complete, when no run queues more than `largest_run` launches: each
    /// marker covers fewer than `every + largest_run` of them, and fewer than
    /// `every` follow the last one.
    pub fn bound(&self, largest_run: u64) -> u64 {
        self.max_markers as u64 * (self.every + largest_run.max(1) - 1) + self.every - 1
    }

    /// Account `n` launches just queued on `stream` (of context `ctx`).
    pub fn note<L: Launcher<Event = E>>(
        &mut self,
        launcher: &L,
        ctx: u64,
        stream: u64,
        n: u64,
    ) -> Result<(), DispatchError> {
        self.stats.issued += n;
        let st = self.streams.entry(stream).or_insert_with(|| StreamState {
            markers: VecDeque::new(),
            unmarked: 0,
        });
        st.unmarked += n;
        if st.unmarked < self.every {
            return Ok(());
        }
        // Pop what finished, then wait for the oldest if the bound is reached.
        while let Some((e, _)) = st.markers.front() {
            if !launcher.event_done(e).map_err(event_err)? {
                break;
            }
            let (e, covered) = st.markers.pop_front().expect("front exists");
            self.stats.completed += covered;
            self.spare.push(e);
        }
        if st.markers.len() >= self.max_markers {
            let (e, covered) = st.markers.pop_front().expect("bound >= 1");
            self.stats.waits += 1;
            let waited = launcher.event_wait(&e).map_err(event_err);
            self.stats.completed += covered;
            self.spare.push(e);
            waited?;
        }
        let e = match self.spare.pop() {
            Some(e) => e,
            None => launcher.event_create(ctx).map_err(event_err)?,
        };
        if let Err(err) = launcher.event_record(&e, stream) {
            self.spare.push(e);
            return Err(event_err(err));
        }
        st.markers.push_back((e, st.unmarked));
        st.unmarked = 0;
        self.stats.markers = self.streams.values().map(|s| s.markers.len()).sum();
        Ok(())
    }

    /// Wait for every marker; launches after the last marker are counted
    /// complete too (the caller synchronised the device or is shutting down).
    pub fn drain<L: Launcher<Event = E>>(&mut self, launcher: &L) -> Result<(), DispatchError> {
        let mut first_err = None;
        for st in self.streams.values_mut() {
            while let Some((e, covered)) = st.markers.pop_front() {
                if let Err(err) = launcher.event_wait(&e) {
                    first_err.get_or_insert(event_err(err));
                }
                self.stats.completed += covered;
                self.spare.push(e);
            }
            self.stats.completed += st.unmarked;
            st.unmarked = 0;
        }
        self.stats.markers = 0;
        first_err.map_or(Ok(()), Err)
    }

    /// Give every event back to the launcher (after drain()).
    pub fn destroy_events<L: Launcher<Event = E>>(&mut self, launcher: &L) {
        for st in self.streams.values_mut() {
            for (e, _) in st.markers.drain(..) {
                launcher.event_destroy(e);
            }
        }
        for e in self.spare.drain(..) {
            launcher.event_destroy(e);
        }
        self.stats.markers = 0;
    }
}

fn event_err((code, message): (i32, String)) -> DispatchError {
    DispatchError::Event { code, message }
}
