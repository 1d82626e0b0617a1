//! Holding off the stop signals while a program is verified and attached.
//!
//! The BPF verifier gives up with EAGAIN when the loading thread has a signal pending, and aya
//! then loads the program again with the verifier's log switched on, growing the buffer tenfold
//! on every ENOSPC: a Ctrl-C in the middle of loading turns seconds of verification (in an
//! emulated guest) into minutes. Blocked, SIGINT and SIGTERM stay pending instead, and reach the
//! run skeleton's handlers the moment the program is in place: a stop is delayed by one load,
//! never lost.

/// SIGINT and SIGTERM blocked in this thread until dropped (the previous mask is restored).
pub struct StopSignalsHeld {
    previous: libc::sigset_t,
}

impl StopSignalsHeld {
    pub fn new() -> Self {
        // SAFETY: sigemptyset/sigaddset initialise the set we own; pthread_sigmask only reads
        // `blocked` and writes the old mask into `previous`, both valid for the call.
        unsafe {
            let mut blocked: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut blocked);
            libc::sigaddset(&mut blocked, libc::SIGINT);
            libc::sigaddset(&mut blocked, libc::SIGTERM);
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &blocked, &mut previous);
            Self { previous }
        }
    }
}

impl Default for StopSignalsHeld {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for StopSignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in new(); a signal that arrived meanwhile is
        // delivered now, to the handlers installed by the run skeleton.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(signal: libc::c_int) -> bool {
        // SAFETY: sigpending fills the zeroed set we own.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut set);
            libc::sigismember(&set, signal) == 1
        }
    }

    #[test]
    fn a_stop_signal_raised_while_held_waits_for_the_release_and_then_ends_the_run() {
        use crate::collect::{Stop, run};
        let _serial = run::tests::serial();
        let stop = run::run(run::Limits::default(), async |stopper: &mut run::Stopper| {
            {
                let _held = StopSignalsHeld::new();
                // SAFETY: raise() sends SIGTERM to this thread, which blocks it; the run
                // skeleton's handler is installed for when it is released.
                unsafe { libc::raise(libc::SIGTERM) };
                assert!(pending(libc::SIGTERM), "held, the signal waits");
            }
            assert!(!pending(libc::SIGTERM), "released, it is delivered");
            Ok(stopper.wait().await)
        })
        .unwrap();
        assert_eq!(stop, Stop::Interrupted, "and it is not lost");
    }
}
