// SPDX-License-Identifier: GPL-2.0
/*
 * cpu_hog - a deterministic latency culprit for mm-probe's latency tests.
 *
 * Writing a number of microseconds to /proc/cpu_hog makes the writing task spin in
 * cpu_hog_hold() for that long on its CPU with preemption disabled, so that a real-time task
 * woken on that CPU meanwhile cannot run until the hold ends. Reading the file returns how many
 * holds ran and their total time, for the test to compare with what the tool measured.
 *
 * cpu_hog_hold() is global and noinline so that it has a symbol of its own, which a kprobe (or
 * fentry) can time, and a frame of its own in the stack of the task that held the CPU: once
 * preemption is enabled again it offers to reschedule from inside itself, on preemptible and
 * voluntary-preemption kernels alike, so the waiting task's switch-in happens there.
 */

#include <linux/atomic.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/module.h>
#include <linux/preempt.h>
#include <linux/proc_fs.h>
#include <linux/sched.h>
#include <linux/uaccess.h>

/* One second at most: far below the soft-lockup (20 s) and RCU stall (21 s) warnings. */
#define CPU_HOG_MAX_USECS	1000000ULL

static atomic64_t cpu_hog_holds = ATOMIC64_INIT(0);
static atomic64_t cpu_hog_held_ns = ATOMIC64_INIT(0);

u64 cpu_hog_hold(u64 usecs);

/* Spins for @usecs with preemption disabled; returns the time it held the CPU, in ns. */
noinline u64 cpu_hog_hold(u64 usecs)
{
	u64 start, deadline, now;

	preempt_disable();
	start = ktime_get_ns();
	deadline = start + usecs * NSEC_PER_USEC;
	do {
		cpu_relax();
		now = ktime_get_ns();
	} while (now < deadline);
	preempt_enable();
	/* Where a voluntary-preemption kernel lets the woken task in. */
	cond_resched();
	return now - start;
}

static ssize_t cpu_hog_write(struct file *file, const char __user *buf, size_t len, loff_t *ppos)
{
	u64 usecs;
	int ret;

	ret = kstrtou64_from_user(buf, len, 10, &usecs);
	if (ret)
		return ret;
	if (usecs > CPU_HOG_MAX_USECS)
		return -EINVAL;
	atomic64_add(cpu_hog_hold(usecs), &cpu_hog_held_ns);
	atomic64_inc(&cpu_hog_holds);
	return len;
}

static ssize_t cpu_hog_read(struct file *file, char __user *buf, size_t len, loff_t *ppos)
{
	char text[64];
	int n;

	n = scnprintf(text, sizeof(text), "holds %lld held_ns %lld\n",
		      (long long)atomic64_read(&cpu_hog_holds),
		      (long long)atomic64_read(&cpu_hog_held_ns));
	return simple_read_from_buffer(buf, len, ppos, text, n);
}

static const struct proc_ops cpu_hog_proc_ops = {
	.proc_read = cpu_hog_read,
	.proc_write = cpu_hog_write,
	.proc_lseek = default_llseek,
};

static int __init cpu_hog_init(void)
{
	if (!proc_create("cpu_hog", 0600, NULL, &cpu_hog_proc_ops))
		return -ENOMEM;
	return 0;
}

static void __exit cpu_hog_exit(void)
{
	/* Waits for writers still inside the file's operations. */
	remove_proc_entry("cpu_hog", NULL);
}

module_init(cpu_hog_init);
module_exit(cpu_hog_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Holds a CPU with preemption disabled on request (mm-probe latency test culprit)");
