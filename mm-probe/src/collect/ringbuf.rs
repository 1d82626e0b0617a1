//! Reading fixed-size records from a BPF ring buffer without blocking the runtime.

use std::{marker::PhantomData, mem::size_of};

use anyhow::{Context as _, Result};
use aya::maps::{Map, MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

/// Reads records of type `T` (a `#[repr(C)]` type from mm-probe-common) from one ring buffer.
pub struct RingReader<T> {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Records too short to be a `T`: a build mismatch, never expected; counted, not hidden.
    pub malformed: u64,
    _record: PhantomData<T>,
}

impl<T: Copy> RingReader<T> {
    pub fn new(map: Map) -> Result<Self> {
        let ring = RingBuf::try_from(map).context("not a ring buffer map")?;
        // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as long as
        // the AsyncFd (which owns the ring buffer) lives.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| anyhow::anyhow!("polling the ring buffer: {e}"))?;
        Ok(Self { ring, malformed: 0, _record: PhantomData })
    }

    /// Waits until records are available, then hands each one to `on_record`. Returns how many.
    pub async fn read(&mut self, mut on_record: impl FnMut(T)) -> Result<usize> {
        let mut guard = self.ring.readable_mut().await.context("waiting on the ring buffer")?;
        let count = drain(guard.get_inner_mut(), &mut self.malformed, &mut on_record);
        guard.clear_ready();
        Ok(count)
    }

    /// Waits until records are available or `tick` has passed, then drains the ring. For rings
    /// whose programs wake user space only in batches (`wakeup_flags` on the kernel side).
    pub async fn read_within(&mut self, tick: std::time::Duration, mut on_record: impl FnMut(T)) -> Result<usize> {
        match tokio::time::timeout(tick, self.ring.readable_mut()).await {
            Ok(guard) => {
                let mut guard = guard.context("waiting on the ring buffer")?;
                let count = drain(guard.get_inner_mut(), &mut self.malformed, &mut on_record);
                guard.clear_ready();
                Ok(count)
            }
            Err(_elapsed) => Ok(self.drain_now(on_record)),
        }
    }

    /// Takes whatever is in the ring right now, without waiting (for the final summary).
    pub fn drain_now(&mut self, mut on_record: impl FnMut(T)) -> usize {
        drain(self.ring.get_mut(), &mut self.malformed, &mut on_record)
    }
}

fn drain<T: Copy>(ring: &mut RingBuf<MapData>, malformed: &mut u64, on_record: &mut impl FnMut(T)) -> usize {
    let mut count = 0;
    while let Some(item) = ring.next() {
        if item.len() < size_of::<T>() {
            *malformed += 1;
            continue;
        }
        // SAFETY: the kernel side wrote a `T` (same #[repr(C)] definition) at the item's start;
        // the item may not be aligned for `T`, hence read_unaligned.
        let record = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<T>()) };
        drop(item);
        on_record(record);
        count += 1;
    }
    count
}
