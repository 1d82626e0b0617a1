/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * hmm_mirror: a test driver that mirrors user memory the way a GPU driver does, with
 * mmu_interval_notifier + hmm_range_fault(), so mm-probe's retry-storm can be checked
 * against a driver's own counts on stock kernels (no DEVICE_PRIVATE needed).
 *
 * User space opens /dev/hmm_mirror and issues HMM_MIRROR_IOC_WALK; the call registers the
 * notifiers, mirrors the range, removes the notifiers and returns the counters below. The
 * flush_* and device_hold_us fields make the callbacks cost what a device's would (a fixed TLB
 * flush, a per-page one) and make another context hold the device lock they take, so that
 * mm-probe invalidations can be checked against known costs.
 */
#ifndef _HMM_MIRROR_UAPI_H
#define _HMM_MIRROR_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

struct hmm_mirror_walk {
	/* in */
	__u64 addr;		/* page aligned start of the user range */
	__u64 length;		/* bytes, a multiple of the page size */
	__u64 chunk_bytes;	/* bytes per hmm_range_fault() walk; 0 = the whole range at once */
	__u64 notifier_bytes;	/* bytes per interval notifier; 0 = one over the whole range */
	__u32 timeout_ms;	/* give a chunk up after this long retrying; 0 = 1000 (HMM default) */
	__u32 flags;		/* 0, or HMM_MIRROR_STALE_SEQ */
	/* out */
	__u64 walks;		/* hmm_range_fault() calls */
	__u64 busy_returns;	/* of which returned -EBUSY */
	__u64 seq_retries;	/* successful walks discarded by mmu_interval_read_retry() */
	__u64 timeouts;		/* chunks given up after -EBUSY past the timeout */
	__u64 seq_timeouts;	/* chunks given up on the read_retry path past the timeout */
	__u64 invalidations;	/* invalidate callbacks run on this call's notifiers */
	__u64 read_begins;	/* mmu_interval_read_begin() calls */
	__u64 chunks;		/* walk units (chunks split at notifier boundaries) */
	__u64 pages_mirrored;	/* valid mirror entries when the call ended */
	__u64 elapsed_ns;	/* whole call, notifier insert to remove */
	__s64 result;		/* 0, or the error that ended the walk (-EBUSY after a timeout) */
	/* in: a simulated device, for mm-probe invalidations */
	__u32 flush_fixed_us;	/* each invalidate callback "flushes the device TLB" this long */
	__u32 flush_per_page_ns;	/* plus this long per page it invalidates */
	__u32 device_hold_us;	/* a device thread holds the device lock this long, again and again */
	__u32 pad;		/* must be 0 */
	/* out */
	__u64 flush_ns;		/* time spent in the simulated flushes */
	__u64 device_lock_waits;	/* callbacks that found the device lock held */
	__u64 device_holds;	/* times the device thread took the device lock */
};

/*
 * A broken driver on purpose: read the notifier sequence once per chunk, before the retry loop
 * instead of inside it, so that after the first -EBUSY every retry walks with a sequence the
 * notifier has already moved past and fails until the timeout. mm-probe must call these
 * retries stale; the normal loop's must never be.
 */
#define HMM_MIRROR_STALE_SEQ	(1U << 0)

#define HMM_MIRROR_IOC_WALK	_IOWR('H', 0x01, struct hmm_mirror_walk)

#endif /* _HMM_MIRROR_UAPI_H */
