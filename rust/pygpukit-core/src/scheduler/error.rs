//! Scheduler errors: misuse is reported, never silently absorbed.

use std::fmt;

use super::task::TaskId;

#[derive(Clone, Debug, PartialEq)]
pub enum SchedError {
    /// Never submitted (or rejected at submission).
    UnknownTask(TaskId),
    /// Completed, failed or cancelled already.
    Ended(TaskId),
    InvalidTransition {
        id: TaskId,
        from: &'static str,
        action: &'static str,
    },
    /// Pacing holds the task back; `until` is when its tenant is next within
    /// share (None: only another task starting or ending can change that).
    Throttled {
        id: TaskId,
        until: Option<f64>,
    },
    InvalidArgument(String),
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedError::UnknownTask(id) => write!(f, "unknown task {id}"),
            SchedError::Ended(id) => write!(f, "task {id} has already ended"),
            SchedError::InvalidTransition { id, from, action } => {
                write!(f, "cannot {action} task {id}: it is {from}")
            }
            SchedError::Throttled { id, until: Some(t) } => {
                write!(f, "task {id} is throttled until t={t:.3} ms")
            }
            SchedError::Throttled { id, until: None } => {
                write!(
                    f,
                    "task {id} is throttled until another task starts or ends"
                )
            }
            SchedError::InvalidArgument(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for SchedError {}
