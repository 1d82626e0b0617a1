//! Errors the user can act on, and the exit codes the design promises.
//!
//! Exit 0: the diagnosis ran (a CRIT verdict is still a successful diagnosis). Exit 1: bad input
//! or an environment that cannot be examined (no privileges, target gone). Exit 2: a failure of
//! mm-probe itself. Exit 3: `triage --check` ran and a finding is CRIT (asked for, so that a
//! health check need not parse the output).

use std::fmt;

/// A problem with the user's input or environment; always says what to do next.
#[derive(Debug)]
pub struct UserError(String);

impl UserError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

pub const EXIT_USAGE: i32 = 1;
pub const EXIT_INTERNAL: i32 = 2;
pub const EXIT_CRIT_FOUND: i32 = 3;

/// Exit code for an error that ended the run.
pub fn exit_code(error: &anyhow::Error) -> i32 {
    if error.chain().any(|e| e.downcast_ref::<UserError>().is_some()) { EXIT_USAGE } else { EXIT_INTERNAL }
}

/// Returns early with a [`UserError`].
#[macro_export]
macro_rules! user_bail {
    ($($arg:tt)*) => { return Err($crate::error::UserError::new(format!($($arg)*)).into()) };
}
