// SPDX-License-Identifier: GPL-2.0
/*
 * hmm_shadow - hmm_mirror built as a second driver: module hmm_shadow, device /dev/hmm_shadow,
 * interval-notifier callback shadow_invalidate. No table of known subscribers names it, so a
 * test that finds its callback timed proves that callbacks are found in the kernel's own
 * structures, not by name.
 */
#define MIRROR_NAME "hmm_shadow"
#define MIRROR_INVALIDATE shadow_invalidate

#include "hmm_mirror.c"
