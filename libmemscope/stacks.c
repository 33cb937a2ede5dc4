// C stacks and allocation sites: frame-pointer walks (libunwind through
// functions that keep no frame pointer: libc's, libstdc++'s, -O2 code's),
// and the lock-free tables that give each distinct stack and each allocation site an
// id written once (R_STACK, R_SITE) and named by MALLOCs from then on.
#include "internal.h"

#include <dlfcn.h>
#include <link.h>

static void *unw_lib;
static int (*unw_backtrace_fn)(void **, int);

// The modules built without frame pointers (libc, libstdc++, libgcc_s: the
// allocator wrappers' modules), and libstdc++'s operator new and new[] (they
// call malloc: with the hook, the allocator's own frames, removed from C
// stacks, SPEC §2.1; libc's and libstdc++'s other frames stay: printf's
// stdio buffer is made in _IO_file_doallocate, strdup's block in strdup).
// Noted at start-up, and again when the loader has loaded more since (a
// site not seen before asks): a program may load libstdc++ later, with the
// first library that needs it (Python with torch). Each list only grows;
// its count is published after its entry, so the hooks read them unlocked.
#define NOFP_MAX 8 // (a process may hold two copies of libstdc++: a conda environment's and the system's)
#define OPNEW_MAX 16
static uintptr_t nofp_lo[NOFP_MAX], nofp_hi[NOFP_MAX];
static _Atomic int nofp_n;
static uintptr_t opnew_lo[OPNEW_MAX], opnew_hi[OPNEW_MAX];
static _Atomic int opnew_n;

static int nofp(uintptr_t pc) {
	int n = atomic_load_explicit(&nofp_n, memory_order_acquire);
	for (int i = 0; i < n; i++)
		if (pc >= nofp_lo[i] && pc < nofp_hi[i]) return 1;
	return 0;
}
static int is_leading_skip(uintptr_t pc) { return in_self(pc) || nofp(pc); }

static int in_opnew(uintptr_t pc) {
	int n = atomic_load_explicit(&opnew_n, memory_order_acquire);
	for (int i = 0; i < n; i++)
		if (pc >= opnew_lo[i] && pc < opnew_hi[i]) return 1;
	return 0;
}
static int is_alloc_frame(uintptr_t pc) { return in_self(pc) || in_opnew(pc); }

// Functions that keep no frame pointer (fpless): a frame-pointer walk
// through one reads whatever it left in rbp as the next frame (a false
// caller, frames lost). A C stack that starts in one is unwound with its
// CFI (libunwind) instead; a walk that reaches one goes on with libunwind
// too, or ends there where the function is libc's or libstdc++'s (their
// start_thread and thread trampolines are below every thread's frames).
// Which functions: the one holding an address is found in its module's
// .eh_frame_hdr table, read in memory from inside dl_iterate_phdr's
// callback (the loader's lock then keeps the module mapped: a dlclose'd
// library is never read), and is fpless unless its code sets up a frame
// pointer first thing (fp_prologue). Answers are kept by address, and
// forgotten when the loader has loaded or unloaded since (modules_note).
#define FPLESS_CACHE 4096
static _Atomic uint64_t fpless_cache[FPLESS_CACHE]; // pc | known << 62 | fpless << 63
static _Atomic uint32_t code_gen; // bumped as the answers are forgotten (a thread's own answer holds within one)

#if defined(__x86_64__)
// The function holding pc in the .eh_frame_hdr table h: its start, or 0.
static const uint8_t *fn_start(const uint8_t *h, uintptr_t pc) {
	uint32_t count;
	memcpy(&count, h + 8, 4);
	const uint8_t *table = h + 12;
	uint32_t lo = 0, hi = count; // the first entry starting after pc
	while (lo < hi) {
		uint32_t m = lo + (hi - lo) / 2;
		int32_t rel;
		memcpy(&rel, table + (size_t)m * 8, 4);
		if ((uintptr_t)(h + rel) <= pc)
			lo = m + 1;
		else
			hi = m;
	}
	if (lo == 0) return NULL;
	int32_t rel;
	memcpy(&rel, table + (size_t)(lo - 1) * 8, 4);
	return h + rel;
}

// Whether the table's layout is the one read here: version 1, the
// eh_frame pointer 4 bytes, the count udata4, the table datarel|sdata4
// (what binutils and lld write).
static int hdr_known(const uint8_t *h) {
	return h[0] == 1 && ((h[1] & 0x0f) == 0x0b || (h[1] & 0x0f) == 0x03) && !(h[1] & 0x80) && h[2] == 0x03 && h[3] == 0x3b;
}

// Whether the code at c (a function's start) sets up a frame pointer:
// push %rbp (after endbr64), then mov %rsp,%rbp with nothing between that
// moves rsp or writes rbp. The compiler may schedule a few register moves
// and clears there (gcc: push %rbp; mov $0x40,%ecx; xor %eax,%eax; mov
// %rsp,%rbp); anything not known to be such ends the look, as fpless (an
// unwind: slower, never wrong). A function saving rbp as just another
// register pushes more, or moves rsp later, into it.
static int fp_prologue(const uint8_t *c) {
	if (c[0] == 0xf3 && c[1] == 0x0f && c[2] == 0x1e && c[3] == 0xfa) c += 4; // endbr64
	if (c[0] != 0x55) return 0;
	c++;
	for (int k = 0; k < 4; k++) {
		if (c[0] == 0x48 && c[1] == 0x89 && c[2] == 0xe5) return 1; // mov %rsp,%rbp
		int rex = (c[0] & 0xf0) == 0x40 ? 1 : 0, r = rex ? c[0] : 0;
		const uint8_t *op = c + rex;
		if (op[0] >= 0xb8 && op[0] <= 0xbf && !(r & 0x08)) { // mov $imm32,%r32
			if ((op[0] & 7) == 4 || (op[0] & 7) == 5) return 0; // esp, ebp (r12, r13 with REX.B: refused too, to no harm)
			c = op + 5;
			continue;
		}
		if ((op[0] == 0x31 || op[0] == 0x89 || op[0] == 0x8b) && (op[1] & 0xc0) == 0xc0) { // xor/mov reg,reg
			int dst = op[0] == 0x8b ? (op[1] >> 3 & 7) | (r & 4 ? 8 : 0) : (op[1] & 7) | (r & 1 ? 8 : 0);
			if (dst == 4 || dst == 5) return 0; // writes rsp or rbp
			c = op + 2;
			continue;
		}
		return 0;
	}
	return 0;
}

struct fn_query {
	uintptr_t pc;
	int fpless;
};

// For the object holding q->pc: whether that function keeps no frame
// pointer (0 where its table is not one read here: walked as before).
static int fn_cb(struct dl_phdr_info *info, size_t sz, void *data) {
	(void)sz;
	struct fn_query *q = data;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
		if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || q->pc < lo || q->pc >= hi) continue;
		const uint8_t *h = NULL;
		for (int j = 0; j < info->dlpi_phnum; j++)
			if (info->dlpi_phdr[j].p_type == PT_GNU_EH_FRAME) h = (const uint8_t *)(info->dlpi_addr + info->dlpi_phdr[j].p_vaddr);
		if (h && hdr_known(h)) {
			const uint8_t *c = fn_start(h, q->pc - 1); // (a return address may be just past its function)
			if (c && (uintptr_t)c >= lo && (uintptr_t)c + 32 <= hi) q->fpless = !fp_prologue(c);
		}
		return 1;
	}
	return 0;
}
#endif

static int modules_note(void);

static int fpless(uintptr_t pc) {
#if defined(__x86_64__)
	uint32_t slot = (uint32_t)((pc * 0x9E3779B97F4A7C15ull) >> 52);
	uint64_t e = atomic_load_explicit(&fpless_cache[slot], memory_order_relaxed);
	if (likely((e & ((1ull << 62) - 1)) == pc && (e >> 62 & 1))) return (int)(e >> 63);
	if (!modules_note()) return 1; // (another thread is noting the modules: unwound, this once)
	struct fn_query q = {pc, 0};
	dl_iterate_phdr(fn_cb, &q);
	atomic_store_explicit(&fpless_cache[slot], pc | 1ull << 62 | (uint64_t)q.fpless << 63, memory_order_relaxed);
	return q.fpless;
#else
	(void)pc;
	return 0; // (not known: walked by frame pointers, as before)
#endif
}

// Adds [lo, hi) to a list unless it holds it; 0 when the list is full.
// Only modules_note adds, one thread at a time (mods_noting); the hooks
// read the lists unlocked, up to the count published after its entry.
static int range_add(uintptr_t *los, uintptr_t *his, _Atomic int *n, int max, uintptr_t lo, uintptr_t hi) {
	int k = atomic_load_explicit(n, memory_order_relaxed);
	for (int i = 0; i < k; i++)
		if (los[i] == lo) return 1;
	if (k == max) return 0;
	los[k] = lo;
	his[k] = hi;
	atomic_store_explicit(n, k + 1, memory_order_release);
	return 1;
}

// A pointer of a loaded object's dynamic section: relocated in place by
// the loader on x86-64, a file address where it is not.
static uintptr_t dyn_ptr(const struct dl_phdr_info *info, uintptr_t p) { return p < info->dlpi_addr ? p + info->dlpi_addr : p; }

// Calls fn with each function a loaded object's dynamic symbol table
// defines (its name, address and size), read in memory: no loader call, as
// this may run inside a malloc the loader made. The symbols are counted by
// the GNU hash table's chains (or the SysV one's count).
HIDDEN void dynsym_each(const struct dl_phdr_info *info, void (*fn)(const char *name, uintptr_t addr, size_t size, void *arg), void *arg) {
	const ElfW(Dyn) *dyn = NULL;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
	if (!dyn) return;
	const ElfW(Sym) *syms = NULL;
	const char *strs = NULL;
	const uint32_t *gnu = NULL, *hash = NULL;
	for (; dyn->d_tag != DT_NULL; dyn++) {
		if (dyn->d_tag == DT_SYMTAB) syms = (const ElfW(Sym) *)dyn_ptr(info, dyn->d_un.d_ptr);
		if (dyn->d_tag == DT_STRTAB) strs = (const char *)dyn_ptr(info, dyn->d_un.d_ptr);
		if (dyn->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)dyn_ptr(info, dyn->d_un.d_ptr);
		if (dyn->d_tag == DT_HASH) hash = (const uint32_t *)dyn_ptr(info, dyn->d_un.d_ptr);
	}
	if (!syms || !strs || (!gnu && !hash)) return;
	uint32_t first = 1, last = 0; // the symbols to look at: [first, last]
	if (hash) {
		last = hash[1] - 1; // nchain: the symbol count
	} else {
		// nbuckets, symoffset, bloom words (64-bit), shift; buckets; chains.
		uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom = gnu[2];
		const uint32_t *buckets = gnu + 4 + bloom * (sizeof(ElfW(Addr)) / 4);
		const uint32_t *chains = buckets + nbuckets;
		for (uint32_t b = 0; b < nbuckets; b++)
			if (buckets[b] > last) last = buckets[b];
		if (last == 0 || last < symoffset) return; // no symbol hashed
		while (!(chains[last - symoffset] & 1)) last++;
		first = symoffset;
	}
	for (uint32_t i = first; i <= last; i++) {
		const ElfW(Sym) *sym = &syms[i];
		if (ELF64_ST_TYPE(sym->st_info) != STT_FUNC || !sym->st_value || sym->st_shndx == SHN_UNDEF) continue;
		fn(strs + sym->st_name, info->dlpi_addr + sym->st_value, sym->st_size, arg);
	}
}

// Notes operator new and new[]'s ranges from libstdc++'s dynamic symbols.
static void opnew_found(const char *name, uintptr_t lo, size_t size, void *arg) {
	static const char *const names[] = {"_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t",
	                                    "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
	                                    "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t"};
	(void)arg;
	if (!size || name[0] != '_' || name[1] != 'Z' || name[2] != 'n') return;
	for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
		if (!strcmp(name, names[k])) range_add(opnew_lo, opnew_hi, &opnew_n, OPNEW_MAX, lo, lo + size);
}

// The loader's counts of loads and unloads, as one number (0 unknown).
static unsigned long long loads_key(const struct dl_phdr_info *info, size_t sz) {
	if (sz < offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) return 0;
	return (unsigned long long)info->dlpi_adds << 32 ^ info->dlpi_subs ^ 1;
}

static int phdr_cb(struct dl_phdr_info *info, size_t sz, void *data) {
	(void)sz, (void)data;
	const char *name = info->dlpi_name;
	if (!name) return 0;
	const char *base = strrchr(name, '/');
	base = base ? base + 1 : name;
	int cxx = !strncmp(base, "libstdc++.so", 12);
	if (strncmp(base, "libc.so", 7) && !cxx && strncmp(base, "libgcc_s.so", 11)) return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
			uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
			range_add(nofp_lo, nofp_hi, &nofp_n, NOFP_MAX, lo, lo + ph->p_memsz);
			break;
		}
	}
	if (cxx) dynsym_each(info, opnew_found, NULL);
	return 0;
}

// The loader's counts (its first object's dl_phdr_info holds them).
static int loads_cb(struct dl_phdr_info *info, size_t sz, void *data) {
	*(unsigned long long *)data = loads_key(info, sz);
	return 1;
}

// Notes the modules above, at start-up and whenever the loader has loaded
// or unloaded since they were last noted (asked once a new site or a new
// return address: a look at the loader's counts, under its lock), and
// forgets the answers kept by address. 1: the lists and answers are the
// loaded modules'; 0: another thread is noting them (not to be trusted
// this once).
static _Atomic int mods_noting;
static _Atomic unsigned long long mods_key; // the loader's counts when the modules were last noted
static int modules_note(void) {
	unsigned long long key = 0;
	dl_iterate_phdr(loads_cb, &key);
	if (key && key == atomic_load_explicit(&mods_key, memory_order_acquire)) return 1;
	if (atomic_exchange_explicit(&mods_noting, 1, memory_order_acquire)) return 0;
	dl_iterate_phdr(phdr_cb, NULL);
	for (int i = 0; i < FPLESS_CACHE; i++) atomic_store_explicit(&fpless_cache[i], 0, memory_order_relaxed);
	atomic_fetch_add_explicit(&code_gen, 1, memory_order_release);
	// Stored after the lists and answers: a thread that sees the counts
	// is sure of what was noted with them.
	atomic_store_explicit(&mods_key, key, memory_order_release);
	atomic_store_explicit(&mods_noting, 0, memory_order_release);
	return 1;
}

static uintptr_t unw_lo, unw_hi;
static size_t unw_tls_modid; // libunwind's TLS module id (0: it has none)

// The executable segment of the module holding data (a function's
// address), and that module's TLS id.
static int unw_range_cb(struct dl_phdr_info *info, size_t sz, void *data) {
	(void)sz;
	uintptr_t fn = (uintptr_t)data;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
		if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && fn >= lo && fn < lo + ph->p_memsz) {
			unw_lo = lo;
			unw_hi = lo + ph->p_memsz;
			unw_tls_modid = info->dlpi_tls_modid;
			return 1;
		}
	}
	return 0;
}

// C stacks, and sites of allocations made through libc/libstdc++ wrappers.
HIDDEN void stacks_load(void) {
	if (unw_lib) return;
	// The loader's records of libunwind and what it needs are links of the
	// chain of loaded objects that a library the program loads later hangs
	// from: recorded as msmemscope's own (no rows), so that the leak scan
	// reads them as blocks, instead of unrecorded heap it cannot see.
	int guard = ms_tls.guard;
	ms_tls.guard = 0;
	own_up();
	unw_lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
	own_down();
	ms_tls.guard = guard;
	set_thr(ms_tls.thr); // the fast path as the guard and own say
	if (unw_lib) unw_backtrace_fn = (int (*)(void **, int))dlsym(unw_lib, "unw_backtrace");
	if (unw_backtrace_fn) dl_iterate_phdr(unw_range_cb, (void *)unw_backtrace_fn);
}

// libunwind's code, loaded for msmemscope alone: what it maps and unmaps
// (its per-thread caches, unmapped as a thread ends) is msmemscope's.
HIDDEN int in_unwinder(uintptr_t pc) { return pc >= unw_lo && pc < unw_hi; }

// libunwind's thread-local block (it is loaded with dlopen: its TLS is
// malloc'd on a thread's first use) is made at the thread's start, as
// msmemscope's own work: asked of the loader directly (__tls_get_addr), one
// small malloc, no unwind. Made later, inside msmemscope's first unwind on
// the thread, its malloc went unrecorded, and glibc's free of it when the
// thread's stack was reused for another read as a FREE of memory no MALLOC
// preceded.
extern void *__tls_get_addr(void *);
HIDDEN void stacks_thread_start(void) {
	if (!unw_tls_modid || ms_tls.guard) return;
	struct {
		unsigned long module, offset;
	} ti = {unw_tls_modid, 0};
	own_up();
	__tls_get_addr(&ti);
	own_down();
}

// The caller's stack unwound with DWARF CFI (libunwind), msmemscope's and
// the allocator's own frames removed.
static __attribute__((noinline)) int unwound(uintptr_t *out, int max) {
	void *buf[MAX_FRAMES + 32];
	int want = max + 32 > MAX_FRAMES + 32 ? MAX_FRAMES + 32 : max + 32;
	int got = unw_backtrace_fn(buf, want), i = 0, n = 0;
	while (i < got && is_alloc_frame((uintptr_t)buf[i])) i++;
	for (; i < got && n < max; i++)
		if (!in_self((uintptr_t)buf[i])) out[n++] = (uintptr_t)buf[i]; // main's wrapper (exitscan.c)
	return n;
}

// Raw return addresses of the caller, innermost first, msmemscope's and the
// allocator's own frames removed.
HIDDEN __attribute__((noinline)) int capture_c(uintptr_t *out, int max) {
	ms_thr *t = tls_thr;
	if (!t) t = thr_acquire();
	int n = 0;
	uintptr_t fp = (uintptr_t)__builtin_frame_address(0);
	uintptr_t lo = fp, first = 0;
	// Find the first frame outside this library.
	while (t && fp >= lo && fp <= t->stack_hi - 16 && !(fp & 7)) {
		uintptr_t ra = ((uintptr_t *)fp)[1];
		uintptr_t next = ((uintptr_t *)fp)[0];
		if (!in_self(ra)) {
			first = ra;
			break;
		}
		if (next <= fp) break;
		fp = next;
	}
	int unwind = first && nofp(first);
	if (first && !unwind) {
		// (a loop allocating from one call site asks about one caller)
		uint32_t gen = atomic_load_explicit(&code_gen, memory_order_acquire);
		if (first != t->fpl_ra || gen != t->fpl_gen) t->fpl_ra = first, t->fpl_gen = gen, t->fpl = fpless(first);
		unwind = t->fpl;
	}
	if (unwind && unw_backtrace_fn) {
		// Called from code without frame pointers (libc's strdup, libstdc++'s
		// operator new, a program built -O2 without -fno-omit-frame-pointer,
		// libpython): unwind with DWARF CFI instead.
		return unwound(out, max);
	}
	while (t && n < max && fp >= lo && fp <= t->stack_hi - 16 && !(fp & 7)) {
		uintptr_t ra = ((uintptr_t *)fp)[1];
		uintptr_t next = ((uintptr_t *)fp)[0];
		if (ra < 4096) break;
		// Below the program's frames, this library's wrapper of main
		// (exitscan.c) is left out too.
		if (n > 0 ? !in_self(ra) : !is_alloc_frame(ra)) out[n++] = ra;
		if (n == max) break;
		// A function without a frame pointer left none to go on from: the
		// walk ends at libc's and libstdc++'s (start_thread and the like,
		// below every thread's frames), and goes on with CFI from others
		// (first was looked at already). Asked before next is judged: such
		// a function's rbp holds whatever it keeps there (a count, 0).
		if (nofp(ra)) break;
		if (ra != first && fpless(ra)) {
			if (!unw_backtrace_fn) break;
			return unwound(out, max);
		}
		if (next <= fp) break;
		fp = next;
	}
	return n;
}

HIDDEN void stacks_modules(void) { modules_note(); }

// The lock-free table at *slot, mapped (bytes long) by whichever thread gets
// there first; *made says whether this call did. NULL if it cannot be mapped.
static void *lazy_table(void *_Atomic *slot, size_t bytes, int *made) {
	void *tab = atomic_load_explicit(slot, memory_order_acquire);
	if (likely(tab != NULL)) return tab;
	tab = raw_mmap(bytes);
	void *none = NULL;
	if (tab && atomic_compare_exchange_strong(slot, &none, tab)) {
		if (made) *made = 1;
		return tab;
	}
	if (tab) raw_munmap(tab, bytes);
	return atomic_load(slot);
}

// The slot of key (nonzero) in the open-addressed table tab (mask + 1
// slots), looked for from slot home on, or a free slot it is put in (*fresh
// set: the caller announces it; fresh NULL: looked for only, 0 if absent).
// Slot 0 stays empty (id 0 means none); 0 when probes slots are all taken
// by others.
static uint32_t intern(uint64_t *tab, uint32_t mask, uint64_t key, uint32_t home, int probes, int *fresh) {
	for (uint32_t i = 0; i < (uint32_t)probes; i++) {
		uint32_t idx = (home + i) & mask;
		if (idx == 0) continue;
		uint64_t cur = atomic_load_explicit((_Atomic uint64_t *)&tab[idx], memory_order_acquire);
		if (cur == key) return idx;
		if (cur == 0) {
			if (!fresh) return 0; // (a look only)
			uint64_t zero = 0;
			if (atomic_compare_exchange_strong((_Atomic uint64_t *)&tab[idx], &zero, key)) {
				*fresh = 1;
				return idx;
			}
			if (zero == key) return idx;
		}
	}
	return 0;
}

// ---- C stacks: each distinct one is written once ----
// A stack is known by a 64-bit hash of its frames (two stacks colliding,
// about 2^-64 a pair, would be reported as one), interned in a lock-free
// table whose slot is its id. The first time, the thread that interns it
// writes an R_STACK record (the frames); MALLOCs then carry the id alone
// (F_STACKID, one payload unit), so a 16-frame MALLOC takes 5 units, not 20.
// Readers collect every R_STACK before handing out records (as R_SITE).
#define STACK_SLOTS (1u << 18)
static uint64_t *_Atomic stack_tab;

static inline uint64_t stack_hash(const uintptr_t *f, int n) {
	uint64_t h = 0x9E3779B97F4A7C15ull * (uint64_t)(n + 1);
	for (int i = 0; i < n; i++) {
		h = (h ^ f[i]) * 0xff51afd7ed558ccdull;
		h ^= h >> 32;
	}
	return h | 1; // 0 marks an empty slot
}

// The id of the stack f[0..n), announced the first time; 0 when the table
// cannot take it (the stack then goes whole).
static uint32_t stack_id(const uintptr_t *f, int n) {
	uint64_t *tab = lazy_table((void *_Atomic *)&stack_tab, STACK_SLOTS * sizeof(uint64_t), NULL);
	if (unlikely(!tab)) return 0;
	uint64_t h = stack_hash(f, n);
	int fresh = 0;
	uint32_t idx = intern(tab, STACK_SLOTS - 1, h, (uint32_t)(h >> 40), 32, &fresh);
	if (fresh) emit(R_STACK, F_CSTACK, stamp_after(), idx, (uint64_t)n, f, (uint32_t)n * sizeof(uintptr_t));
	return idx;
}

HIDDEN __attribute__((noinline)) void emit_with_cstack(uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site) {
	int depth = *(volatile int *)&cfg_cstack; // read once: the Python API may change it meanwhile
	if (depth < 1) depth = 1;
	uintptr_t frames[depth]; // as deep as asked: a small frame stays in cache
	int n = capture_c(frames, depth);
	ms_thr *t = tls_thr;
	uint64_t id = 0;
	if (n && !ms_rotating) {
		// The thread's last stack again (a loop): its id without hashing.
		if (t && n == t->stk_n && !memcmp(frames, t->stk_f, (size_t)n * sizeof frames[0])) {
			id = t->stk_id;
		} else if ((id = stack_id(frames, n)) && t && n <= STK_MEMO) {
			memcpy(t->stk_f, frames, (size_t)n * sizeof frames[0]);
			t->stk_n = n, t->stk_id = (uint32_t)id;
		}
	}
	if (id && t)
		emit1(t, kind, flags | F_CSTACK | F_STACKID, ts, a, b, site, id);
	else
		emit_n(kind, flags | (n ? F_CSTACK : 0), ts, a, b, frames, n * sizeof(uintptr_t), site);
}

// A MALLOC with a Python stack (and a C stack when asked for): see pystack.h.
HIDDEN __attribute__((noinline)) void emit_with_stacks(uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site) {
	int maxc = *(volatile int *)&cfg_cstack, maxp = *(volatile int *)&ms_py_depth; // read once (ms_set_hook)
	if (maxc < 0) maxc = 0;
	if (maxp < 0) maxp = 0;
	uint64_t buf[1 + maxc + maxp];
	int nc = maxc ? capture_c((uintptr_t *)&buf[1], maxc) : 0;
	int np = ms_py_capture(&buf[1 + nc], maxp);
	if (!np) {
		emit_n(R_MALLOC, flags | (nc ? F_CSTACK : 0), ts, a, b, &buf[1], nc * sizeof(uint64_t), site);
		return;
	}
	buf[0] = enc_pystack_head((uint32_t)nc, (uint32_t)np);
	emit_n(R_MALLOC, flags | F_PYSTACK | (nc ? F_CSTACK : 0), ts, a, b, buf, (1 + nc + np) * sizeof(uint64_t), site);
}

// ---- allocation sites: every MALLOC names its caller, stacks or not ----
// A site is the allocator's caller (the first frame outside libc, libstdc++
// and msmemscope when the caller is a wrapper such as operator new or strdup),
// interned in a lock-free table; its 16-bit id rides in the record's n and
// the address is written once, as an R_SITE record (SPEC §7 live report).
HIDDEN uintptr_t *_Atomic site_tab;

// The caller of the wrapper (strdup, fopen...) that called the allocator, or
// 0 when that is this library: cgo's C calls pthread_getattr_np, which reads
// /proc/self/maps, when a program thread first enters msmemscope's Go code.
static __attribute__((noinline)) uintptr_t site_through_wrapper(uintptr_t ra) {
	// A short walk first: operator new's caller is a frame past the hook's
	// (a C++ program, or Python with torch, makes most of its allocations
	// so, each through here: a deep stack walked whole cost several times
	// more); stdio's buffer allocation sits ~7 libc frames deep.
	void *buf[24];
	for (int want = 10;; want = 24) {
		int got = unw_backtrace_fn(buf, want), i = 0;
		while (i < got && in_self((uintptr_t)buf[i])) i++; // the hook
		while (i < got && nofp((uintptr_t)buf[i])) i++;    // the wrappers
		if (i < got && in_self((uintptr_t)buf[i])) return 0;
		for (; i < got; i++)
			if (!is_leading_skip((uintptr_t)buf[i])) return (uintptr_t)buf[i];
		if (got < want || want == 24) return ra;
	}
}

static __attribute__((noinline)) uint32_t site_insert(uintptr_t *tab, uintptr_t ra, uint32_t h) {
	int fresh = 0;
	uint32_t idx = intern((uint64_t *)tab, SITE_SLOTS - 1, ra, h, 16, &fresh);
	if (fresh) emit(R_SITE, 0, stamp_after(), ra, idx, NULL, 0);
	return idx; // 0: crowded, the site stays unknown
}

HIDDEN uint32_t site_miss(uintptr_t ra, uint32_t h) {
	uintptr_t *tab = atomic_load_explicit(&site_tab, memory_order_acquire);
	if (unlikely(!tab)) {
		int made = 0;
		tab = lazy_table((void *_Atomic *)&site_tab, SITE_SLOTS * sizeof(uintptr_t), &made);
		if (!tab) return 0;
		if (made) ms_fast_update(); // the fast path needs the table
		if (h != 0 && atomic_load_explicit((_Atomic uintptr_t *)&tab[h], memory_order_relaxed) == ra) return h;
	}
	if (!nofp(ra)) {
		// A caller seen before, away from its home slot; else a new one,
		// which may be a wrapper in a module loaded since (noted first: a
		// wrapper's own address never becomes a site).
		uint32_t idx = intern((uint64_t *)tab, SITE_SLOTS - 1, ra, h, 16, NULL);
		if (idx) return idx;
		if (!modules_note()) return 0; // (another thread is noting them: unknown, this once)
	}
	if (unlikely(nofp(ra)) && unw_backtrace_fn) {
		if (!(ra = site_through_wrapper(ra))) return SITE_SELF;
		h = site_hash(ra);
	}
	return site_insert(tab, ra, h);
}
