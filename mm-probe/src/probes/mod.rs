//! The probe catalog and the attach planner.
//!
//! Each capability names its logical probes ("THP allow-check", "hmm_range_fault walk") with an
//! ordered list of candidates (fentry/fexit, then kprobe/kretprobe, then tracepoints), each with
//! the kernel symbol names it may carry. The planner really loads and attaches them in order and
//! returns a plan: what attached, and for what did not, every attempt and why it failed
//! ([`AttachFailure`]); [`Plan::unavailable_summary`] is how the commands tell the user.

pub mod catalog;
pub mod failure;
pub mod object;
pub mod planner;
pub mod unavailable;

pub use catalog::{Candidate, Hook, LogicalProbe, Mechanism, Target};
pub use failure::AttachFailure;
pub use object::{GlobalValue, MapFamily, load_object, select_processes};
pub use planner::{Attempt, Outcome, Plan, Planner, ProbePlan, detach_all};
pub use unavailable::{DOCTOR_POINTER, unavailable_summary};
