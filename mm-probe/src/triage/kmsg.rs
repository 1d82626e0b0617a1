//! The kernel log of the watch's window: the lines where HMM or a device driver says a fault or
//! a walk timed out, the chapter's first symptom of a stalled application. /dev/kmsg is opened
//! and moved to its end before the watch, so only the window's records are read after it.

use std::{
    fs::File,
    io::{ErrorKind, Read as _, Seek as _, SeekFrom},
    os::unix::fs::OpenOptionsExt as _,
};

/// At most this many of the window's matching lines are kept (the count covers them all).
pub const KEPT_LINES: usize = 5;

/// /dev/kmsg, positioned at the end of the log when the watch began.
pub struct KernelLog(File);

/// What the window's log said.
#[derive(Debug, Default, PartialEq)]
pub struct Window {
    pub matching: u64,
    pub kept: Vec<String>,
    /// Records overwritten before they were read (the log's ring wrapped during the watch).
    pub overwritten: bool,
}

impl KernelLog {
    /// Opens the log at its end; the error says why it cannot be read.
    pub fn open_at_end() -> Result<Self, String> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .map_err(|e| format!("cannot read /dev/kmsg: {e}"))?;
        file.seek(SeekFrom::End(0)).map_err(|e| format!("cannot seek /dev/kmsg: {e}"))?;
        Ok(Self(file))
    }

    /// The window's records that match, read without waiting for more.
    pub fn read_window(mut self) -> Window {
        let mut window = Window::default();
        // One record per read; a record is at most about 8 KiB (printk's limit).
        let mut record = vec![0u8; 16 * 1024];
        loop {
            match self.0.read(&mut record) {
                Ok(0) => break,
                Ok(n) => take(&mut window, &String::from_utf8_lossy(&record[..n])),
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => window.overwritten = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        window
    }
}

/// Counts one record (`prio,seq,usec,flags;message`) if its message is about an HMM or device
/// fault timing out.
fn take(window: &mut Window, record: &str) {
    let message = record.split_once(';').map_or(record, |(_, m)| m).lines().next().unwrap_or("").trim();
    if !is_a_timeout(message) {
        return;
    }
    window.matching += 1;
    if window.kept.len() < KEPT_LINES {
        window.kept.push(message.to_string());
    }
}

/// HMM's own words, or a fault or walk that timed out or hung. Matched on the words, not on a
/// list of drivers: any driver's line that says so counts.
fn is_a_timeout(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    let timed_out = ["timeout", "timed out", "time out", "hang", "hung"].iter().any(|w| lower.contains(w));
    let about_memory = ["hmm", "fault", "mmu_notifier", "svm", "page"].iter().any(|w| lower.contains(w));
    lower.contains("hmm_range_fault") || (timed_out && about_memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_fault_timeouts_count_and_other_lines_do_not() {
        let mut window = Window::default();
        take(&mut window, "3,1234,5678,-;amdgpu: svm_range_restore_work: hmm_range_fault failed -16");
        take(&mut window, "4,1235,5679,-;nouveau 0000:01:00.0: fault timed out");
        take(&mut window, "6,1236,5680,-;usb 1-1: new high-speed USB device");
        take(&mut window, "6,1237,5681,-;nfs: server x not responding, timed out");
        assert_eq!(window.matching, 2, "{window:?}");
        assert_eq!(window.kept[1], "nouveau 0000:01:00.0: fault timed out");
    }

    #[test]
    fn only_the_first_lines_are_kept_and_all_are_counted() {
        let mut window = Window::default();
        for i in 0..KEPT_LINES + 3 {
            take(&mut window, &format!("3,{i},0,-;hmm_range_fault timeout {i}"));
        }
        assert_eq!((window.matching, window.kept.len()), ((KEPT_LINES + 3) as u64, KEPT_LINES));
    }
}
