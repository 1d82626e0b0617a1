//! Shared bits of the test workloads. Each workload is one binary under `src/bin/`, named for
//! what it makes the kernel do; the end-to-end tests find them next to their own executable.
pub mod thp;
