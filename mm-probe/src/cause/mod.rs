//! Why invalidations happen: the kernel programs' bracket probes and globals, the names of the
//! causes they decide, and the knob that stops each one, read on this machine. Shared by every
//! capability that counts invalidations.

pub mod knobs;
pub mod names;
pub mod probes;

pub use knobs::{Knob, knobs, remedy, settings_line};
pub use names::{CauseName, Namer};
