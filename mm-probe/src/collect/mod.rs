//! Getting data out of the kernel: ring-buffer readers on tokio, per-CPU counters, and the end
//! of a run (duration elapsed or Ctrl-C).

pub mod counters;
pub mod ringbuf;
pub mod shutdown;

pub use ringbuf::RingReader;
pub use shutdown::{Stop, StopSignals, wait_for_stop};
