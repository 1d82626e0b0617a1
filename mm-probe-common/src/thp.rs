//! Records shared by the thp programs and user space (filled in by that capability).
