//! Records shared by the latency programs and user space (filled in by that capability).
