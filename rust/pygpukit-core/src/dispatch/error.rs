//! Why a plan could not be built or run.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchError {
    /// The plan is malformed (an index out of range, a bad dimension).
    BadPlan(String),
    /// The call does not match the plan (input or output counts).
    BadCall(String),
    /// A temporary could not be allocated; nothing was launched.
    OutOfMemory { nbytes: u64 },
    /// The launcher failed with this driver code and message; launches before
    /// it in the plan were queued.
    Launch {
        kernel: usize,
        code: i32,
        message: String,
    },
    /// An event call (completion tracking) failed.
    Event { code: i32, message: String },
}

impl fmt::Display for DispatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DispatchError::BadPlan(m) => write!(f, "bad launch plan: {m}"),
            DispatchError::BadCall(m) => write!(f, "bad dispatch call: {m}"),
            DispatchError::OutOfMemory { nbytes } => {
                write!(f, "out of pool memory for a {nbytes}-byte temporary")
            }
            DispatchError::Launch {
                kernel,
                code,
                message,
            } => write!(
                f,
                "launch {kernel} of the plan failed: CUDA error {code}: {message}"
            ),
            DispatchError::Event { code, message } => {
                write!(f, "completion event failed: CUDA error {code}: {message}")
            }
        }
    }
}

impl std::error::Error for DispatchError {}
