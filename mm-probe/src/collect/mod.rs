//! Getting data out of the kernel: ring-buffer readers on tokio, per-CPU counters, the run
//! skeleton every command shares (`run`: runtime, stop handlers, ticks) and the run driver on
//! top of it (`driver`: the Capability and Session traits, and the order of every run).

pub mod clock;
pub mod counters;
pub mod driver;
pub mod memory;
pub mod ringbuf;
pub mod run;
pub mod shutdown;

pub use clock::monotonic_ns;
pub use ringbuf::RingReader;
pub use run::{Limits, Stopper, Ticker};
pub use shutdown::Stop;
