// SPDX-License-Identifier: GPL-2.0
/*
 * hmm_mirror - a test driver that mirrors user memory like a GPU driver.
 *
 * Debian's kernels have CONFIG_HMM_MIRROR but not CONFIG_DEVICE_PRIVATE, so the kernel's own
 * lib/test_hmm.c cannot load there. This driver needs neither device memory nor hardware: its
 * "device page table" is an array of pfns, kept coherent with the CPU page tables by
 * mmu_interval_notifiers and filled by hmm_range_fault() in the retry loop every in-tree
 * caller uses (nouveau_range_fault, dmirror_range_fault, xe_hmm):
 *
 *	seq = mmu_interval_read_begin(notifier);
 *	mmap_read_lock(mm); ret = hmm_range_fault(&range); mmap_read_unlock(mm);
 *	if (ret == -EBUSY) retry until the timeout;
 *	lock; if (mmu_interval_read_retry(notifier, seq)) { unlock; retry; } store pfns; unlock;
 *
 * One ioctl mirrors one user range with a chosen walk size and notifier granularity and
 * returns the driver's own counters, which mm-probe's retry-storm must reproduce.
 */

#include <linux/completion.h>
#include <linux/fs.h>
#include <linux/hmm.h>
#include <linux/kthread.h>
#include <linux/ktime.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/sched/prio.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>

#include "hmm_mirror_uapi.h"

/*
 * The driver's names: hmm_shadow.c builds this file again as another driver (module, device,
 * device thread and callback symbol), one that no table of known subscribers names.
 */
#ifndef MIRROR_NAME
#define MIRROR_NAME "hmm_mirror"
#endif
#ifndef MIRROR_INVALIDATE
#define MIRROR_INVALIDATE mirror_invalidate
#endif

/* Bounds that keep one call's allocations small (64 Ki notifiers, 2 MiB of pfns). */
#define MIRROR_MAX_BYTES	(1UL << 30)
#define MIRROR_MAX_NOTIFIERS	65536UL
#define MIRROR_DEFAULT_TIMEOUT_MS	1000U	/* HMM_RANGE_DEFAULT_TIMEOUT */

struct mirror;

/* One interval notifier and the slice of the mirror it guards. */
struct mirror_notifier {
	struct mmu_interval_notifier sub;
	struct mirror *mirror;
	unsigned long start;
	unsigned long end;
	bool inserted;
};

/* The state of one HMM_MIRROR_IOC_WALK call. */
struct mirror {
	struct mm_struct *mm;
	unsigned long start;
	unsigned long npages;
	/*
	 * The "device page table" lock. A spinning lock, so the invalidate callback never sleeps
	 * and can accept non-blockable invalidations (the OOM reaper) instead of failing them. An
	 * rwlock taken for write rather than a spinlock: a spinlock's first waiter spins on the
	 * pending bit without passing lock:contention_begin, so its waits would be invisible to
	 * the tracer the test checks against this driver's own count.
	 */
	rwlock_t lock;
	unsigned long *device_pfns;	/* the mirror, one entry per page, under lock */
	unsigned long *walk_pfns;	/* hmm_range_fault() output for one chunk */
	atomic64_t invalidations;
	/* The simulated device (see hmm_mirror_uapi.h). */
	u32 flush_fixed_us;
	u32 flush_per_page_ns;
	u32 device_hold_us;
	atomic64_t flush_ns;
	atomic64_t device_lock_waits;
	atomic64_t device_holds;
	struct task_struct *device_thread;
	struct completion device_started;
	unsigned long nr_notifiers;
	struct mirror_notifier notifiers[];
};

/*
 * Busy-waits `ns` by the clock rather than udelay(): udelay's loop count is calibrated once at
 * boot, and under emulation on a busy host that calibration was seen 6x off (a 40 us/page flush
 * took 6 us a page), which would make the device's costs a guess instead of ground truth.
 */
static void mirror_delay_ns(u64 ns)
{
	u64 until = ktime_get_ns() + ns;

	while (ktime_get_ns() < until)
		cpu_relax();
}

/*
 * What a device driver's callback does under its lock: shoot down the device's TLB, here a
 * busy-wait of a fixed part and a per-page part. Never sleeps: the callback may be called
 * non-blockable.
 */
static void mirror_flush(struct mirror *mirror, unsigned long start, unsigned long end)
{
	u64 pages = start < end ? (end - start) >> PAGE_SHIFT : 0;
	u64 ns = (u64)mirror->flush_fixed_us * NSEC_PER_USEC + pages * mirror->flush_per_page_ns;
	u64 began;

	if (!ns)
		return;
	began = ktime_get_ns();
	mirror_delay_ns(ns);
	atomic64_add(ktime_get_ns() - began, &mirror->flush_ns);
}

/*
 * The device's own use of its lock: held for device_hold_us, then let go for a quarter of that
 * (busy, not asleep: sleeps under emulation last milliseconds, and the callbacks would then
 * rarely find the lock taken). At the highest fair-class weight (see mirror_create) it keeps
 * nearly all of one CPU of the guest's two for the ioctl's length; the walker and the storm
 * share the other.
 */
static int mirror_device_thread(void *data)
{
	struct mirror *mirror = data;
	u64 hold_ns = (u64)mirror->device_hold_us * NSEC_PER_USEC;

	while (!kthread_should_stop()) {
		write_lock(&mirror->lock);
		mirror_delay_ns(hold_ns);
		write_unlock(&mirror->lock);
		if (atomic64_inc_return(&mirror->device_holds) == 1)
			complete(&mirror->device_started);
		mirror_delay_ns(hold_ns / 4);
		cond_resched();
	}
	return 0;
}

static bool MIRROR_INVALIDATE(struct mmu_interval_notifier *sub,
			      const struct mmu_notifier_range *range,
			      unsigned long cur_seq)
{
	struct mirror_notifier *mn = container_of(sub, struct mirror_notifier, sub);
	struct mirror *mirror = mn->mirror;
	unsigned long start = max(range->start, mn->start);
	unsigned long end = min(range->end, mn->end);

	if (!write_trylock(&mirror->lock)) {
		atomic64_inc(&mirror->device_lock_waits);
		write_lock(&mirror->lock);
	}
	mmu_interval_set_seq(sub, cur_seq);
	/* The mirror forgets the pages, then "flushes the device TLB" as a device would. */
	if (start < end)
		memset(&mirror->device_pfns[(start - mirror->start) >> PAGE_SHIFT], 0,
		       ((end - start) >> PAGE_SHIFT) * sizeof(unsigned long));
	mirror_flush(mirror, start, end);
	write_unlock(&mirror->lock);
	atomic64_inc(&mirror->invalidations);
	return true;
}

static const struct mmu_interval_notifier_ops mirror_notifier_ops = {
	.invalidate = MIRROR_INVALIDATE,
};

/* remove() waits for running callbacks; none runs after it returns. */
static void mirror_remove_notifiers(struct mirror *mirror)
{
	unsigned long i;

	for (i = 0; i < mirror->nr_notifiers; i++) {
		if (mirror->notifiers[i].inserted)
			mmu_interval_notifier_remove(&mirror->notifiers[i].sub);
		mirror->notifiers[i].inserted = false;
	}
}

static void mirror_free(struct mirror *mirror)
{
	if (mirror->device_thread)
		kthread_stop(mirror->device_thread);
	mirror_remove_notifiers(mirror);
	kvfree(mirror->walk_pfns);
	kvfree(mirror->device_pfns);
	kvfree(mirror);
}

static struct mirror *mirror_create(struct mm_struct *mm, const struct hmm_mirror_walk *req,
				    unsigned long walk_bytes)
{
	unsigned long notifier_bytes = req->notifier_bytes ? req->notifier_bytes : req->length;
	unsigned long nr = DIV_ROUND_UP(req->length, notifier_bytes);
	struct mirror *mirror;
	unsigned long i;
	int ret;

	if (nr > MIRROR_MAX_NOTIFIERS)
		return ERR_PTR(-E2BIG);
	mirror = kvzalloc(struct_size(mirror, notifiers, nr), GFP_KERNEL);
	if (!mirror)
		return ERR_PTR(-ENOMEM);
	mirror->mm = mm;
	mirror->start = req->addr;
	mirror->npages = req->length >> PAGE_SHIFT;
	rwlock_init(&mirror->lock);
	init_completion(&mirror->device_started);
	atomic64_set(&mirror->invalidations, 0);
	mirror->flush_fixed_us = req->flush_fixed_us;
	mirror->flush_per_page_ns = req->flush_per_page_ns;
	mirror->device_hold_us = req->device_hold_us;
	mirror->device_pfns = kvcalloc(mirror->npages, sizeof(unsigned long), GFP_KERNEL);
	mirror->walk_pfns = kvcalloc(walk_bytes >> PAGE_SHIFT, sizeof(unsigned long), GFP_KERNEL);
	mirror->nr_notifiers = nr;
	if (!mirror->device_pfns || !mirror->walk_pfns) {
		mirror_free(mirror);
		return ERR_PTR(-ENOMEM);
	}
	for (i = 0; i < nr; i++) {
		struct mirror_notifier *mn = &mirror->notifiers[i];

		mn->mirror = mirror;
		mn->start = req->addr + i * notifier_bytes;
		mn->end = min(mn->start + notifier_bytes, (unsigned long)(req->addr + req->length));
		ret = mmu_interval_notifier_insert(&mn->sub, mm, mn->start, mn->end - mn->start,
						   &mirror_notifier_ops);
		if (ret) {
			mirror_free(mirror);
			return ERR_PTR(ret);
		}
		mn->inserted = true;
	}
	if (mirror->device_hold_us) {
		mirror->device_thread = kthread_create(mirror_device_thread, mirror, MIRROR_NAME "_dev");
		if (IS_ERR(mirror->device_thread)) {
			ret = PTR_ERR(mirror->device_thread);
			mirror->device_thread = NULL;
			mirror_free(mirror);
			return ERR_PTR(ret);
		}
		/*
		 * The device runs while the walk does, from its start. The thread lives for one
		 * ioctl (a few ms under emulation); as a new fair-class task of default weight it
		 * waited out its start debit behind the walker and the storm, and on 6.1 it held
		 * the lock 9 times in 85 ioctls, so the callbacks never met it held. So it gets
		 * the highest fair weight, and the walk starts only once it has held the lock.
		 * Not a real-time class: a busy real-time thread starved the per-CPU kernel
		 * threads of PREEMPT_RT kernels (RCU stalls, the guest wedged).
		 */
		set_user_nice(mirror->device_thread, MIN_NICE);
		wake_up_process(mirror->device_thread);
		wait_for_completion(&mirror->device_started);
	}
	return mirror;
}

static void mirror_store(struct mirror *mirror, const struct hmm_range *range)
{
	unsigned long first = (range->start - mirror->start) >> PAGE_SHIFT;
	unsigned long n = (range->end - range->start) >> PAGE_SHIFT;

	memcpy(&mirror->device_pfns[first], mirror->walk_pfns, n * sizeof(unsigned long));
}

/*
 * Mirrors [start, end), which lies inside one notifier's interval, with the driver retry
 * loop. The timeout runs from the first read_begin, as in nouveau and xe. With
 * HMM_MIRROR_STALE_SEQ the sequence is read once, before the loop: the bug under test.
 */
static int mirror_chunk(struct mirror *mirror, struct mirror_notifier *mn, unsigned long start,
			unsigned long end, u64 timeout_ns, struct hmm_mirror_walk *out)
{
	bool stale_seq = out->flags & HMM_MIRROR_STALE_SEQ;
	struct hmm_range range = {
		.notifier = &mn->sub,
		.start = start,
		.end = end,
		.hmm_pfns = mirror->walk_pfns,
		.default_flags = HMM_PFN_REQ_FAULT,
		.pfn_flags_mask = 0,
	};
	u64 deadline_ns = ktime_get_ns() + timeout_ns;
	int ret;

	if (stale_seq) {
		range.notifier_seq = mmu_interval_read_begin(range.notifier);
		out->read_begins++;
	}
	for (;;) {
		if (fatal_signal_pending(current))
			return -EINTR;
		if (!stale_seq) {
			range.notifier_seq = mmu_interval_read_begin(range.notifier);
			out->read_begins++;
		}
		mmap_read_lock(mirror->mm);
		ret = hmm_range_fault(&range);
		mmap_read_unlock(mirror->mm);
		out->walks++;
		if (ret == -EBUSY) {
			out->busy_returns++;
			if (ktime_get_ns() >= deadline_ns) {
				out->timeouts++;
				return -EBUSY;
			}
			continue;
		}
		if (ret)
			return ret;

		write_lock(&mirror->lock);
		if (mmu_interval_read_retry(range.notifier, range.notifier_seq)) {
			write_unlock(&mirror->lock);
			out->seq_retries++;
			/* Not in the brief loop of every driver, but an ioctl must not spin forever. */
			if (ktime_get_ns() >= deadline_ns) {
				out->seq_timeouts++;
				return -EBUSY;
			}
			continue;
		}
		mirror_store(mirror, &range);
		write_unlock(&mirror->lock);
		return 0;
	}
}

static unsigned long mirror_count_valid(struct mirror *mirror)
{
	unsigned long i, valid = 0;

	write_lock(&mirror->lock);
	for (i = 0; i < mirror->npages; i++)
		if (mirror->device_pfns[i] & HMM_PFN_VALID)
			valid++;
	write_unlock(&mirror->lock);
	return valid;
}

static int mirror_walk(struct hmm_mirror_walk *req)
{
	struct mm_struct *mm = current->mm;
	unsigned long end = req->addr + req->length;
	unsigned long notifier_bytes, walk_bytes, addr;
	u64 start_ns = ktime_get_ns();
	u64 timeout_ns;
	struct mirror *mirror;
	int ret = 0;

	if (!mm || (req->flags & ~HMM_MIRROR_STALE_SEQ) || req->pad || !req->length || req->device_hold_us > 1000 ||
	    req->flush_fixed_us > 10000 || !req->length || req->length > MIRROR_MAX_BYTES ||
	    !PAGE_ALIGNED(req->addr) || !PAGE_ALIGNED(req->length) ||
	    !PAGE_ALIGNED(req->chunk_bytes) || !PAGE_ALIGNED(req->notifier_bytes) ||
	    end < req->addr)
		return -EINVAL;
	notifier_bytes = req->notifier_bytes ? req->notifier_bytes : req->length;
	/* A walk is bounded by its notifier: hmm_range names exactly one. */
	walk_bytes = req->chunk_bytes ? min_t(unsigned long, req->chunk_bytes, notifier_bytes)
				      : notifier_bytes;
	walk_bytes = min_t(unsigned long, walk_bytes, req->length);
	timeout_ns = (u64)(req->timeout_ms ? req->timeout_ms : MIRROR_DEFAULT_TIMEOUT_MS) *
		     NSEC_PER_MSEC;

	mirror = mirror_create(mm, req, walk_bytes);
	if (IS_ERR(mirror))
		return PTR_ERR(mirror);

	for (addr = req->addr; addr < end;) {
		unsigned long index = (addr - req->addr) / notifier_bytes;
		struct mirror_notifier *mn = &mirror->notifiers[index];
		unsigned long chunk_end = min(addr + walk_bytes, mn->end);

		req->chunks++;
		ret = mirror_chunk(mirror, mn, addr, chunk_end, timeout_ns, req);
		if (ret)
			break;
		addr = chunk_end;
	}
	req->result = ret;
	req->pages_mirrored = mirror_count_valid(mirror);
	/*
	 * The device thread stops and the notifiers go first, so that the counts are final: a
	 * callback can still start between the last walk and the removal.
	 */
	if (mirror->device_thread) {
		kthread_stop(mirror->device_thread);
		mirror->device_thread = NULL;
	}
	mirror_remove_notifiers(mirror);
	req->invalidations = atomic64_read(&mirror->invalidations);
	req->flush_ns = atomic64_read(&mirror->flush_ns);
	req->device_lock_waits = atomic64_read(&mirror->device_lock_waits);
	req->device_holds = atomic64_read(&mirror->device_holds);
	mirror_free(mirror);
	req->elapsed_ns = ktime_get_ns() - start_ns;
	/* The counters are the answer even when the walk gave up; only -EINTR is an error. */
	return ret == -EINTR ? ret : 0;
}

static long mirror_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct hmm_mirror_walk req;
	int ret;

	if (cmd != HMM_MIRROR_IOC_WALK)
		return -ENOTTY;
	if (copy_from_user(&req, (void __user *)arg, sizeof(req)))
		return -EFAULT;
	req.walks = req.busy_returns = req.seq_retries = req.timeouts = 0;
	req.seq_timeouts = req.invalidations = req.read_begins = req.chunks = 0;
	req.pages_mirrored = req.elapsed_ns = 0;
	req.flush_ns = req.device_lock_waits = req.device_holds = 0;
	req.result = 0;
	ret = mirror_walk(&req);
	if (ret)
		return ret;
	if (copy_to_user((void __user *)arg, &req, sizeof(req)))
		return -EFAULT;
	return 0;
}

/*
 * .owner pins the module while the device is open, so rmmod is refused (EBUSY) during a
 * walk, and every notifier is removed before the ioctl returns: nothing outlives a call.
 */
static const struct file_operations mirror_fops = {
	.owner = THIS_MODULE,
	.unlocked_ioctl = mirror_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice mirror_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = MIRROR_NAME,
	.fops = &mirror_fops,
	.mode = 0600,
};

static int __init mirror_init(void)
{
	return misc_register(&mirror_device);
}

static void __exit mirror_exit(void)
{
	misc_deregister(&mirror_device);
}

module_init(mirror_init);
module_exit(mirror_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("HMM mirror test driver for mm-probe: hmm_range_fault retry loops on demand");
