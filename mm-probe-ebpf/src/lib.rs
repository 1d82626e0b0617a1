//! Empty on purpose: the crate is a build-dependency of mm-probe (so cargo rebuilds the embedded
//! object when these sources change), and the programs live in the `mm-probe` binary target.
#![no_std]
