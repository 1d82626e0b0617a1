//! Records shared by the hmm programs and user space (filled in by that capability).
