//! `pygpukit._rust.SchedulerCore`: admission, lifecycle and pacing of
//! compiled-graph launches. Time is always passed in (milliseconds).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pygpukit_core::scheduler::{
    Admission, Partition, Qos, SchedError, SchedStats, Scheduler, TaskId, TaskSpec,
    DEFAULT_GUARD_MS, DEFAULT_MIN_IDLE_MS,
};
use pyo3::exceptions::{PyKeyError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::PyDict;

use crate::errors;

mod step;

fn to_py(py: Python<'_>, e: SchedError) -> PyErr {
    let msg = e.to_string();
    match e {
        SchedError::UnknownTask(_) | SchedError::Ended(_) => PyKeyError::new_err(msg),
        SchedError::InvalidTransition { .. } | SchedError::Throttled { .. } => {
            PyRuntimeError::new_err(msg)
        }
        SchedError::InvalidArgument(_) => errors::value_error(py, msg),
    }
}

/// A byte count: negative is out of its domain, 2**64 and up past what it holds.
fn bytes_arg(py: Python<'_>, what: &str, v: i128) -> PyResult<u64> {
    if v < 0 {
        return Err(errors::value_error(
            py,
            format!("{what} must be >= 0, got {v}"),
        ));
    }
    u64::try_from(v)
        .map_err(|_| errors::overflow_error(py, format!("{what} must be < 2**64, got {v}")))
}

/// Priorities are C ints in the core and in CUDA.
fn int32_arg(py: Python<'_>, what: &str, v: i128) -> PyResult<i32> {
    i32::try_from(v).map_err(|_| {
        errors::overflow_error(py, format!("{what} must be in [-2**31, 2**31), got {v}"))
    })
}

/// The dispatcher thread's wait (`arm_wait`, `wait_dispatcher`): what it
/// plans and what other threads asked of it.
struct DispatchWait {
    /// The dispatcher is about to wait or waits (between `arm_wait` and the
    /// wait's return). Wake-ups only matter then: otherwise it is looking at
    /// the scheduler under the caller's lock, after whoever asked.
    armed: bool,
    /// It looks at the core itself while it waits (see `wait_dispatcher`).
    watching: bool,
    /// When it plans to wake (the caller's clock, ms).
    planned: f64,
    /// Return to the caller.
    woken: bool,
    /// A watching wait asks the core again when a task may start.
    replan: bool,
    /// Times a watching wait woke, found every waiting task still held by the
    /// core and slept on, without returning to Python: held work waiting
    /// natively (`stats()["held_rechecks"]`).
    held_rechecks: u64,
}

/// Thread-safe scheduler core. `capacity_bytes` is the node memory that
/// reservations draw on (the pool quota); a "default" partition spans it.
#[pyclass(frozen, name = "SchedulerCore", module = "pygpukit._rust")]
pub struct PySchedulerCore {
    inner: Mutex<Scheduler>,
    wait: Mutex<DispatchWait>,
    wake: Condvar,
}

fn poisoned() -> PyErr {
    PyRuntimeError::new_err("SchedulerCore is poisoned by an earlier panic")
}

/// Longest single sleep of a wait: a deadline far off (or infinite) is
/// slept towards in steps that `Duration` can hold.
const MAX_SLEEP_MS: f64 = 1e6;

impl PySchedulerCore {
    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Scheduler) -> R) -> PyResult<R> {
        let mut guard = self.inner.lock_py_attached(py).map_err(|_| poisoned())?;
        Ok(f(&mut guard))
    }

    /// The wait state; only held for a few instructions (never while waiting
    /// for the interpreter), so a plain lock cannot deadlock with it.
    fn wait_state(&self) -> MutexGuard<'_, DispatchWait> {
        self.wait.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes an armed dispatcher: back to its caller (`woken`), or, for a
    /// watching wait, only to ask the core again (`replan`).
    fn signal(&self, replan_only: bool) {
        let mut w = self.wait_state();
        if !w.armed {
            return;
        }
        if replan_only && w.watching {
            w.replan = true;
        } else {
            w.woken = true;
        }
        self.wake.notify_all();
    }

    /// `signal` if a waiting task may start before the dispatcher plans to
    /// wake (`wakeup`: the core's next_wakeup; `ready`: one may start now).
    fn signal_if_sooner(&self, ready: bool, wakeup: Option<f64>) {
        let planned = self.wait_state().planned;
        if ready {
            self.signal(false);
        } else if wakeup.is_some_and(|t| t < planned) {
            self.signal(true);
        }
    }
}

fn stats_dict<'py>(py: Python<'py>, s: &SchedStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("capacity_bytes", s.capacity_bytes)?;
    d.set_item("reserved_bytes", s.reserved_bytes)?;
    d.set_item("queue_length", s.queue_length)?;
    d.set_item("waiting", s.waiting)?;
    d.set_item("running", s.running)?;
    let c = &s.counts;
    for (k, v) in [
        ("submitted", c.submitted),
        ("admitted", c.admitted),
        ("queued", c.queued),
        ("rejected", c.rejected),
        ("started", c.started),
        ("completed", c.completed),
        ("failed", c.failed),
        ("cancelled", c.cancelled),
        ("throttled", c.throttled),
        ("held_for_guaranteed", c.held_for_guaranteed),
        ("held_for_duty", c.held_for_duty),
    ] {
        d.set_item(k, v)?;
    }
    d.set_item("best_effort_duty", s.best_effort_duty)?;
    d.set_item("best_effort_tokens_ms", s.best_effort_tokens_ms)?;
    let tasks = PyDict::new(py);
    for (id, t) in &s.tasks {
        let e = PyDict::new(py);
        e.set_item("tenant", &t.tenant)?;
        e.set_item("partition", &t.partition)?;
        e.set_item("qos", t.qos.name())?;
        e.set_item("state", t.state.name())?;
        e.set_item("reservation_bytes", t.reservation_bytes)?;
        tasks.set_item(id, e)?;
    }
    d.set_item("tasks", tasks)?;
    let tenants = PyDict::new(py);
    for (name, t) in &s.tenants {
        let e = PyDict::new(py);
        e.set_item("share", t.share)?;
        e.set_item("tokens_ms", t.tokens_ms)?;
        e.set_item("gpu_time_ms", t.gpu_time_ms)?;
        e.set_item("live_tasks", t.live_tasks)?;
        e.set_item("completed", t.completed)?;
        e.set_item("failed", t.failed)?;
        e.set_item("throttled_tasks", t.throttled_tasks)?;
        e.set_item("held_tasks", t.held_tasks)?;
        e.set_item("expected_ms", t.expected_ms)?;
        e.set_item("guaranteed_gap_ms", t.guaranteed_gap_ms)?;
        tenants.set_item(name, e)?;
    }
    d.set_item("tenants", tenants)?;
    let parts = PyDict::new(py);
    for (name, p) in &s.partitions {
        let e = PyDict::new(py);
        e.set_item("memory_quota_bytes", p.memory_quota_bytes)?;
        e.set_item("reserved_bytes", p.reserved_bytes)?;
        e.set_item("bandwidth_share", p.bandwidth_share)?;
        e.set_item("stream_priority", p.stream_priority)?;
        parts.set_item(name, e)?;
    }
    d.set_item("partitions", parts)?;
    Ok(d)
}

type SubmitResult = (TaskId, &'static str, Option<String>, Vec<TaskId>);
type SubmitStartResult = (
    TaskId,
    &'static str,
    Option<String>,
    Vec<TaskId>,
    Option<i32>,
);

#[allow(clippy::too_many_arguments)]
fn task_spec(
    py: Python<'_>,
    tenant: String,
    reservation_bytes: i128,
    qos: &str,
    priority: i128,
    partition: &str,
    bandwidth_share: f64,
    deadline_ms: Option<f64>,
) -> PyResult<TaskSpec> {
    let qos = Qos::parse(qos).ok_or_else(|| {
        errors::value_error(
            py,
            format!("qos must be 'guaranteed', 'burstable' or 'best_effort', got {qos:?}"),
        )
    })?;
    Ok(TaskSpec {
        tenant,
        reservation_bytes: bytes_arg(py, "reservation_bytes", reservation_bytes)?,
        qos,
        priority: int32_arg(py, "priority", priority)?,
        partition: partition.to_string(),
        bandwidth_share,
        deadline_ms,
    })
}

fn admission_of(a: Admission) -> (&'static str, Option<String>) {
    match a {
        Admission::Admitted => ("admitted", None),
        Admission::Queued => ("queued", None),
        Admission::Rejected(reason) => ("rejected", Some(reason)),
    }
}

#[pymethods]
impl PySchedulerCore {
    /// `guard_ms`: margin kept between a best-effort launch's expected end and
    /// the next expected Guaranteed arrival; `min_idle_ms`: least silence after
    /// which a Guaranteed tenant counts as idle.
    #[new]
    #[pyo3(signature = (capacity_bytes, burst_ms = 50.0, guard_ms = DEFAULT_GUARD_MS, min_idle_ms = DEFAULT_MIN_IDLE_MS))]
    fn new(
        py: Python<'_>,
        capacity_bytes: i128,
        burst_ms: f64,
        guard_ms: f64,
        min_idle_ms: f64,
    ) -> PyResult<Self> {
        let cap = bytes_arg(py, "capacity_bytes", capacity_bytes)?;
        let mut inner = Scheduler::new(cap, burst_ms).map_err(|e| to_py(py, e))?;
        inner.set_guard_ms(guard_ms).map_err(|e| to_py(py, e))?;
        inner
            .set_min_idle_ms(min_idle_ms)
            .map_err(|e| to_py(py, e))?;
        Ok(Self {
            inner: Mutex::new(inner),
            wait: Mutex::new(DispatchWait {
                armed: false,
                watching: false,
                planned: f64::INFINITY,
                woken: false,
                replan: false,
                held_rechecks: 0,
            }),
            wake: Condvar::new(),
        })
    }

    #[pyo3(signature = (name, memory_quota_bytes, bandwidth_share = 1.0, stream_priority = 0))]
    fn add_partition(
        &self,
        py: Python<'_>,
        name: String,
        memory_quota_bytes: i128,
        bandwidth_share: f64,
        stream_priority: i128,
    ) -> PyResult<()> {
        let p = Partition {
            name,
            memory_quota_bytes: bytes_arg(py, "memory_quota_bytes", memory_quota_bytes)?,
            bandwidth_share,
            stream_priority: int32_arg(py, "stream_priority", stream_priority)?,
        };
        self.with(py, |s| s.add_partition(p))?
            .map_err(|e| to_py(py, e))
    }

    /// Limits best-effort launches together to `duty` of the GPU's time over
    /// `window_ms` from `now` (1: no limit); see the core's
    /// `set_best_effort_duty`.
    fn set_best_effort_duty(
        &self,
        py: Python<'_>,
        duty: f64,
        window_ms: f64,
        now: f64,
    ) -> PyResult<()> {
        self.with(py, |s| s.set_best_effort_duty(duty, window_ms, now))?
            .map_err(|e| to_py(py, e))
    }

    /// Returns (task_id, "admitted" | "queued" | "rejected", reason or None,
    /// ids of other queued tasks this submission let in).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (tenant, reservation_bytes, *, now, qos = "burstable", priority = 0, partition = "default", bandwidth_share = 1.0, deadline_ms = None))]
    fn submit(
        &self,
        py: Python<'_>,
        tenant: String,
        reservation_bytes: i128,
        now: f64,
        qos: &str,
        priority: i128,
        partition: &str,
        bandwidth_share: f64,
        deadline_ms: Option<f64>,
    ) -> PyResult<SubmitResult> {
        let spec = task_spec(
            py,
            tenant,
            reservation_bytes,
            qos,
            priority,
            partition,
            bandwidth_share,
            deadline_ms,
        )?;
        let r = self
            .with(py, |s| s.submit(spec, now))?
            .map_err(|e| to_py(py, e))?;
        let (status, reason) = admission_of(r.admission);
        Ok((r.id, status, reason, r.also_admitted))
    }

    /// `submit` and, when `start` (the caller may launch now) and pacing picks
    /// this task, its start, in one call (positional arguments: this is the
    /// scheduler's per-submission path). Returns (task_id, status, reason or
    /// None, ids of other queued tasks this submission let in, the stream
    /// priority of the started task or None when it did not start here).
    #[allow(clippy::too_many_arguments)]
    fn submit_start(
        &self,
        py: Python<'_>,
        tenant: String,
        reservation_bytes: i128,
        now: f64,
        qos: &str,
        priority: i128,
        partition: &str,
        bandwidth_share: f64,
        deadline_ms: Option<f64>,
        start: bool,
    ) -> PyResult<SubmitStartResult> {
        let spec = task_spec(
            py,
            tenant,
            reservation_bytes,
            qos,
            priority,
            partition,
            bandwidth_share,
            deadline_ms,
        )?;
        let (r, prio) = self
            .with(py, |s| s.submit_and_start(spec, now, start))?
            .map_err(|e| to_py(py, e))?;
        let (status, reason) = admission_of(r.admission);
        Ok((r.id, status, reason, r.also_admitted, prio))
    }

    /// The largest reservation in `partition` admitted now without overtaking
    /// queued tasks (None: no such partition): how much room this device has.
    fn headroom(&self, py: Python<'_>, partition: &str) -> PyResult<Option<u64>> {
        self.with(py, |s| s.headroom(partition))
    }

    /// Whether pacing lets the admitted task start now (counts a throttle if not).
    fn may_start(&self, py: Python<'_>, task_id: TaskId, now: f64) -> PyResult<bool> {
        self.with(py, |s| s.may_start(task_id, now))?
            .map_err(|e| to_py(py, e))
    }

    /// `now` if the task may start, else when its tenant is back within its
    /// share, or None when only another task starting or ending can free it.
    fn next_start_time(&self, py: Python<'_>, task_id: TaskId, now: f64) -> PyResult<Option<f64>> {
        self.with(py, |s| s.next_start_time(task_id, now))?
            .map_err(|e| to_py(py, e))
    }

    /// The admitted task that should start next, or None if pacing holds all back.
    fn pick_next(&self, py: Python<'_>, now: f64) -> PyResult<Option<TaskId>> {
        self.with(py, |s| s.pick_next(now))?
            .map_err(|e| to_py(py, e))
    }

    /// Picks the next task and starts it in one step: (task_id, stream
    /// priority), or None if every waiting task is held back (those count as
    /// throttled or held for Guaranteed work).
    fn pick_and_start(&self, py: Python<'_>, now: f64) -> PyResult<Option<(TaskId, i32)>> {
        self.with(py, |s| s.pick_and_start(now))?
            .map_err(|e| to_py(py, e))
    }

    /// The earliest time after `now` a waiting task could start with no other
    /// event (a bucket refilling, a Guaranteed tenant going idle), or None.
    fn next_wakeup(&self, py: Python<'_>, now: f64) -> PyResult<Option<f64>> {
        self.with(py, |s| s.next_wakeup(now))?
            .map_err(|e| to_py(py, e))
    }

    /// Starts an admitted task; returns the CUDA stream priority to launch on.
    /// Raises RuntimeError if pacing holds it back or it is not admitted.
    fn start(&self, py: Python<'_>, task_id: TaskId, now: f64) -> PyResult<i32> {
        self.with(py, |s| s.start(task_id, now))?
            .map_err(|e| to_py(py, e))
    }

    /// Ends a running task with its measured GPU time; returns the ids
    /// admitted from the queue with the memory it freed.
    fn complete(
        &self,
        py: Python<'_>,
        task_id: TaskId,
        gpu_ms: f64,
        now: f64,
    ) -> PyResult<Vec<TaskId>> {
        self.with(py, |s| s.complete(task_id, gpu_ms, now))?
            .map_err(|e| to_py(py, e))
    }

    fn fail(
        &self,
        py: Python<'_>,
        task_id: TaskId,
        gpu_ms: f64,
        now: f64,
    ) -> PyResult<Vec<TaskId>> {
        self.with(py, |s| s.fail(task_id, gpu_ms, now))?
            .map_err(|e| to_py(py, e))
    }

    /// Withdraws a queued or admitted task; returns the ids admitted in its place.
    fn cancel(&self, py: Python<'_>, task_id: TaskId) -> PyResult<Vec<TaskId>> {
        self.with(py, |s| s.cancel(task_id))?
            .map_err(|e| to_py(py, e))
    }

    /// "queued", "admitted" or "running"; KeyError once the task has ended.
    fn state(&self, py: Python<'_>, task_id: TaskId) -> PyResult<&'static str> {
        self.with(py, |s| s.state(task_id).map(|st| st.name()))?
            .map_err(|e| to_py(py, e))
    }

    fn queue_order(&self, py: Python<'_>) -> PyResult<Vec<TaskId>> {
        self.with(py, |s| s.queue_order())
    }

    /// `complete` for an end seen by the thread that waited for it, with what
    /// that thread needs to decide whether to leave the rest of the end's
    /// bookkeeping for later: (ids admitted from the queue, whether a waiting
    /// task may start now). An armed dispatcher is woken here, without the
    /// interpreter, when a task may start now or sooner than it planned. The
    /// native step's end (scheduler/step.rs) calls it too.
    fn complete_waited(
        &self,
        py: Python<'_>,
        task_id: TaskId,
        gpu_ms: f64,
        now: f64,
    ) -> PyResult<(Vec<TaskId>, bool)> {
        let (others, ready, wakeup) = self
            .with(py, |s| -> Result<_, SchedError> {
                let others = s.complete(task_id, gpu_ms, now)?;
                let (ready, wakeup) = s.ready_or_wakeup(now)?;
                Ok((others, ready, wakeup))
            })?
            .map_err(|e| to_py(py, e))?;
        self.signal_if_sooner(ready, wakeup);
        Ok((others, ready))
    }

    /// The native on-caller step of a Guaranteed tenant's checked submit options
    /// (pygpukit/scheduler/scheduler.py's `_check_submit`): a `GuaranteedStep` whose
    /// `submit(args)` admits, starts and launches a task in one call, or returns None
    /// having changed nothing. `objects`: the scheduler's lock ("mu"), the exec lock,
    /// the Task, CudaDevice and Done classes, the device's `_poll`, `time.perf_counter`,
    /// the tasks' future lock, the wall clock's "t0", "prio_high", "sim_bytes_per_ms",
    /// "spare_max" (SPARE_ARENA_MAX) and "ended_kept" (ENDED_KEPT).
    #[allow(clippy::too_many_arguments)]
    fn guaranteed_step(
        slf: &Bound<'_, Self>,
        sched: Py<PyAny>,
        func: Py<PyAny>,
        tenant: String,
        partition: String,
        bandwidth: f64,
        priority: i128,
        objects: &Bound<'_, PyDict>,
    ) -> PyResult<Py<step::GuaranteedStep>> {
        let py = slf.py();
        let priority = int32_arg(py, "priority", priority)?;
        step::new_step(
            py,
            slf.clone().unbind(),
            sched,
            func,
            tenant,
            partition,
            bandwidth,
            priority,
            objects,
        )
    }

    /// Wakes the dispatcher if a waiting task may start (by itself, with no
    /// other event) before it plans to wake: a watching wait only asks the
    /// core again, without returning to Python.
    fn kick(&self, py: Python<'_>, now: f64) -> PyResult<()> {
        let wakeup = self
            .with(py, |s| s.next_wakeup(now))?
            .map_err(|e| to_py(py, e))?;
        self.signal_if_sooner(false, wakeup);
        Ok(())
    }

    /// Wakes the dispatcher (armed or waiting) back to its caller.
    fn wake_dispatcher(&self) {
        self.signal(false);
    }

    /// The dispatcher is about to wait until `until` (its clock, ms); called
    /// under the caller's lock, so a wake-up asked for between the lock's
    /// release and `wait_dispatcher` is not lost. `watch`: see wait_dispatcher.
    fn arm_wait(&self, until: f64, watch: bool) {
        let mut w = self.wait_state();
        w.armed = true;
        w.watching = watch;
        w.planned = until;
        w.woken = false;
        w.replan = false;
    }

    /// The dispatcher's sleep, without the GIL: returns "woken"
    /// (wake_dispatcher, or a kick of a plain wait), "ready" (`watch`: a
    /// waiting task may start now) or "deadline" (`until` passed). `now` is
    /// the caller's clock at the call; the wait follows it on the same
    /// monotonic clock. A watching wait sleeps to the core's next_wakeup as
    /// well, and when that passes with every task still held (a busy
    /// Guaranteed tenant pushes its idle time on with every step) it sleeps
    /// again here: the threads stepping that tenant never lose the GIL to it.
    fn wait_dispatcher(
        &self,
        py: Python<'_>,
        now: f64,
        until: f64,
        watch: bool,
    ) -> PyResult<&'static str> {
        if !now.is_finite() || until.is_nan() {
            return Err(errors::value_error(
                py,
                format!(
                    "wait_dispatcher: now must be finite and until a number, got {now}, {until}"
                ),
            ));
        }
        let t0 = Instant::now();
        let clock = || now + t0.elapsed().as_secs_f64() * 1e3;
        let out = py.detach(|| {
            let mut w = self.wait_state();
            let mut slept = false;
            let outcome = loop {
                if w.woken {
                    break Ok("woken");
                }
                w.replan = false;
                let t = clock();
                if t >= until {
                    break Ok("deadline");
                }
                let mut wake = until;
                if watch {
                    let Ok(mut core) = self.inner.lock() else {
                        break Err(None);
                    };
                    match core.pick_next(t) {
                        Ok(Some(_)) => break Ok("ready"),
                        Ok(None) => {}
                        Err(e) => break Err(Some(e)),
                    }
                    match core.next_wakeup(t) {
                        Ok(c) => wake = c.map_or(wake, |c| wake.min(c)),
                        Err(e) => break Err(Some(e)),
                    }
                    // Woken (a hold's planned lapse, a replan) with everything still
                    // held: back to sleep here, the interpreter untouched.
                    w.held_rechecks += u64::from(slept);
                }
                slept = true;
                w.planned = wake;
                let ms = (wake - t).clamp(0.0, MAX_SLEEP_MS);
                w = self
                    .wake
                    .wait_timeout(w, Duration::from_secs_f64(ms / 1e3))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            };
            w.armed = false;
            w.woken = false;
            w.planned = f64::INFINITY;
            outcome
        });
        out.map_err(|e| match e {
            Some(e) => to_py(py, e),
            None => poisoned(),
        })
    }

    #[pyo3(signature = (now = None))]
    fn stats<'py>(&self, py: Python<'py>, now: Option<f64>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.with(py, |s| s.stats(now))?;
        let d = stats_dict(py, &st)?;
        d.set_item("held_rechecks", self.wait_state().held_rechecks)?;
        Ok(d)
    }
}
