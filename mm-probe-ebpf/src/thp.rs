//! Kernel programs for this hook area (filled in by its capability).
