// The CUDA virtual memory management API's bookkeeping (cuda.c wraps the
// calls): which device each allocation handle of cuMemCreate is on, and
// what cuMemMap mapped where, so that an R_VMAP names its handle's device
// and an R_VUNMAP the handle and device it unmaps (a rotated log read alone
// then needs no earlier one).
//
// Two open-addressing tables (linear probing, backward-shift deletion: no
// tombstones) under one spinlock: the calls are rare (PyTorch's expandable
// segments map 2 or 20 MiB chunks) and the driver's own work is far longer.
// Static, allocating nothing; untouched pages cost a program without VMM
// nothing. A full table forgets: a map then has the current device, an
// unmap no handle.
#include "internal.h"

#define VMM_UNKNOWN UINT64_MAX // as cuda.c's NO_DEVICE
#define NH (1u << 16)          // handles
#define NM (1u << 16)          // mappings

static struct vh {
	uint64_t h, dev;
} handles[NH];
static struct vm {
	uint64_t va, size, h, dev;
} maps[NM];
static unsigned nhandles, nmaps;
static atomic_flag vmm_lock = ATOMIC_FLAG_INIT;

static void lock(void) {
	while (atomic_flag_test_and_set_explicit(&vmm_lock, memory_order_acquire)) {
	}
}
static void unlock(void) { atomic_flag_clear_explicit(&vmm_lock, memory_order_release); }

static unsigned home(uint64_t k, unsigned n) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 32) & (n - 1); }

// The slot of h, or the empty one where it would go (called locked).
static unsigned hslot(uint64_t h) {
	unsigned i = home(h, NH);
	while (handles[i].h && handles[i].h != h) i = (i + 1) & (NH - 1);
	return i;
}
static unsigned mslot(uint64_t va) {
	unsigned i = home(va, NM);
	while (maps[i].va && maps[i].va != va) i = (i + 1) & (NM - 1);
	return i;
}

// Backward-shift deletion of slot i: the entries after it that may move back
// do (keys are never 0: an empty slot).
#define DROP(tab, n, key, i)                                                                  \
	do {                                                                                 \
		unsigned j_ = (i);                                                           \
		for (;;) {                                                                   \
			j_ = (j_ + 1) & ((n) - 1);                                           \
			if (!tab[j_].key) break;                                             \
			unsigned h_ = home(tab[j_].key, (n));                                \
			if ((j_ > (i) && (h_ <= (i) || h_ > j_)) || (j_ < (i) && h_ <= (i) && h_ > j_)) { \
				tab[(i)] = tab[j_];                                          \
				(i) = j_;                                                    \
			}                                                                    \
		}                                                                            \
		tab[(i)].key = 0;                                                            \
	} while (0)

// cuMemCreate made handle h on dev (VMM_UNKNOWN: not a device's memory).
HIDDEN void vmm_handle_put(uint64_t h, uint64_t dev) {
	if (!h) return;
	lock();
	unsigned i = hslot(h);
	if (handles[i].h || nhandles < NH / 2) {
		if (!handles[i].h) nhandles++;
		handles[i] = (struct vh){h, dev};
	}
	unlock();
}

// cuMemRelease released h.
HIDDEN void vmm_handle_drop(uint64_t h) {
	if (!h) return;
	lock();
	unsigned i = hslot(h);
	if (handles[i].h) {
		DROP(handles, NH, h, i);
		nhandles--;
	}
	unlock();
}

// Whether handle h is known; *dev its device (VMM_UNKNOWN: not a device's).
HIDDEN int vmm_handle_dev(uint64_t h, uint64_t *dev) {
	int found = 0;
	if (!h) return 0;
	lock();
	unsigned i = hslot(h);
	if (handles[i].h) *dev = handles[i].dev, found = 1;
	unlock();
	return found;
}

// cuMemMap mapped [va, va+size) to handle h on dev.
HIDDEN void vmm_map_put(uint64_t va, uint64_t size, uint64_t h, uint64_t dev) {
	if (!va) return;
	lock();
	unsigned i = mslot(va);
	if (maps[i].va || nmaps < NM / 2) {
		if (!maps[i].va) nmaps++;
		maps[i] = (struct vm){va, size, h, dev};
	}
	unlock();
}

// cuMemUnmap unmapped [va, va+size): the mappings that tile it from va
// on are forgotten (the driver unmaps a range of adjacent mappings at
// once). *h is their handle when they were the whole range and all of one
// handle (else 0), *dev the first one's device. Returns the mappings
// forgotten (0: none known there).
HIDDEN int vmm_map_take(uint64_t va, uint64_t size, uint64_t *h, uint64_t *dev) {
	int n = 0, one = 1;
	uint64_t at = va, end = va + size;
	*h = 0, *dev = VMM_UNKNOWN;
	lock();
	while (at && at < end) {
		unsigned i = mslot(at);
		if (!maps[i].va || !maps[i].size) break;
		if (n == 0)
			*h = maps[i].h, *dev = maps[i].dev;
		else if (maps[i].h != *h)
			one = 0;
		at += maps[i].size;
		DROP(maps, NM, va, i);
		nmaps--;
		n++;
	}
	unlock();
	if (!one || at != end) *h = 0;
	return n;
}
