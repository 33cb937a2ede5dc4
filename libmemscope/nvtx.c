// NVTX as mstx (SPEC §4.4): msmemscope is an NVTX injection library, the
// mechanism NVIDIA's own tools use. Every library built with the NVTX
// headers (PyTorch, the `nvtx` Python package, a program's own code) loads
// the library NVTX_INJECTION64_PATH names on its first NVTX call (the CLI
// sets it to this library, unless another tool's is set) and calls
// InitializeInjectionNvtx2, which fills NVTX's function tables with the
// functions below: marks become MSTX Mark rows, ranges Range_start and
// Range_end rows (a range named "step start" is a step, as with mstx).
// The structures are NVTX's (nvtxDetail/nvtxTypes.h, nvToolsExt.h),
// declared here so that building needs no NVTX header.
#include "internal.h"

#include <stddef.h>

#include "../include/mstx/ms_tools_ext.h"

typedef void (*nvtx_fn)(void);
typedef struct {
	size_t struct_size;
	int (*GetModuleFunctionTable)(int module, nvtx_fn ***table, unsigned *size);
} nvtx_callbacks;
typedef const void *(*nvtx_get_export_table)(uint32_t id);

enum { NVTX_ETID_CALLBACKS = 1, NVTX_CB_MODULE_CORE = 1, NVTX_CB_MODULE_CORE2 = 5 };
enum {
	CORE_MarkEx = 1, CORE_MarkA = 2, CORE_RangeStartEx = 4, CORE_RangeStartA = 5, CORE_RangeEnd = 7,
	CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePop = 11,
};
enum {
	CORE2_DomainMarkEx = 1, CORE2_DomainRangeStartEx = 2, CORE2_DomainRangeEnd = 3, CORE2_DomainRangePushEx = 4,
	CORE2_DomainRangePop = 5, CORE2_DomainRegisterStringA = 10, CORE2_DomainCreateA = 12,
};
enum { MSG_ASCII = 1, MSG_REGISTERED = 3 };

// nvtxEventAttributes_v2, up to its message.
typedef struct {
	uint16_t version, size;
	uint32_t category;
	int32_t color_type;
	uint32_t color;
	int32_t payload_type, reserved0;
	uint64_t payload;
	int32_t message_type;
	const void *message;
} nvtx_attr;

// A registered string (nvtxDomainRegisterStringA): its handle points here.
typedef struct {
	char text[256];
} nvtx_string;

static const char *attr_message(const nvtx_attr *a) {
	if (!a || a->size < offsetof(nvtx_attr, message) + sizeof(void *) || !a->message) return "";
	if (a->message_type == MSG_ASCII) return (const char *)a->message;
	if (a->message_type == MSG_REGISTERED) return ((const nvtx_string *)a->message)->text;
	return ""; // wide strings and payload-only events: no message
}


// NVTX's marks and ranges are mstx's (capi_shims.c): the same rows, ids
// and step ranges.
static uint64_t range_start(const char *msg) { return mstxRangeStartA(msg ? msg : "", NULL); }

// Pushed ranges nest per thread and per domain: each thread keeps its open
// ones, innermost last, in a block of its own made on its first push (a
// pointer in static TLS, not the block: the library's static TLS must stay
// small, for libraries Python loads after it). Deeper than PUSH_MAX, a push
// is counted, not recorded, and so is its pop.
#define PUSH_MAX 64
typedef struct {
	int depth, over;
	const void *domain[PUSH_MAX];
	uint64_t id[PUSH_MAX];
} push_stack;
static __thread push_stack *pushed __attribute__((tls_model("initial-exec")));

static push_stack *stack_of_thread(void) {
	if (!pushed) {
		own_up(); // msmemscope's memory: no rows
		pushed = calloc(1, sizeof *pushed);
		own_down();
	}
	return pushed;
}

// The level of a domain's next push: how many of its ranges are open.
static int level(const push_stack *st, const void *domain) {
	int n = 0;
	for (int i = 0; i < st->depth; i++) n += st->domain[i] == domain;
	return n;
}

static int push(const void *domain, const char *msg) {
	push_stack *st = stack_of_thread();
	if (!st) return -1;
	int lv = level(st, domain);
	if (st->depth == PUSH_MAX) {
		st->over++;
		return lv + st->over - 1;
	}
	st->domain[st->depth] = domain;
	st->id[st->depth++] = range_start(msg);
	return lv;
}

// Ends the domain's innermost open range; -2 (NVTX's "nothing to pop")
// when it has none.
static int pop(const void *domain) {
	push_stack *st = pushed;
	if (!st) return -2;
	if (st->over > 0) { // the pushes past PUSH_MAX went innermost
		st->over--;
		return level(st, domain) + st->over;
	}
	int i = st->depth - 1;
	while (i >= 0 && st->domain[i] != domain) i--;
	if (i < 0) return -2;
	mstxRangeEnd(st->id[i]);
	for (int j = i; j + 1 < st->depth; j++) st->domain[j] = st->domain[j + 1], st->id[j] = st->id[j + 1];
	st->depth--;
	return level(st, domain);
}

static void markA(const char *msg) { mstxMarkA(msg ? msg : "", NULL); }
static void markEx(const nvtx_attr *a) { markA(attr_message(a)); }
static uint64_t startA(const char *msg) { return range_start(msg); }
static uint64_t startEx(const nvtx_attr *a) { return range_start(attr_message(a)); }
static void end(uint64_t id) { mstxRangeEnd(id); }
static int pushA(const char *msg) { return push(NULL, msg); }
static int pushEx(const nvtx_attr *a) { return push(NULL, attr_message(a)); }
static int popCore(void) { return pop(NULL); }

static void dmarkEx(const void *d, const nvtx_attr *a) { (void)d, markEx(a); }
static uint64_t dstartEx(const void *d, const nvtx_attr *a) { return (void)d, startEx(a); }
static void dend(const void *d, uint64_t id) { (void)d, end(id); }
static int dpushEx(const void *d, const nvtx_attr *a) { return push(d, attr_message(a)); }
static int dpop(const void *d) { return pop(d); }

// Registered strings and domains live as long as the process, as NVTX's
// own handles do: msmemscope's memory (no rows).
static void *own_alloc(size_t n) {
	own_up();
	void *p = calloc(1, n);
	own_down();
	return p;
}
static const void *dregister(const void *d, const char *s) {
	(void)d;
	nvtx_string *h = own_alloc(sizeof *h);
	if (h && s) strncpy(h->text, s, sizeof h->text - 1);
	return h;
}
static const void *dcreate(const char *name) {
	(void)name;
	return own_alloc(1); // a distinct handle per domain
}

static void fill(const nvtx_callbacks *cb, int module, const int *ids, nvtx_fn const *fns, int n) {
	nvtx_fn **table = NULL;
	unsigned size = 0;
	if (!cb->GetModuleFunctionTable(module, &table, &size) || !table) return;
	for (int i = 0; i < n; i++)
		if ((unsigned)ids[i] < size && table[ids[i]]) *table[ids[i]] = fns[i];
}

int InitializeInjectionNvtx2(nvtx_get_export_table get) {
	const nvtx_callbacks *cb = get ? (const nvtx_callbacks *)get(NVTX_ETID_CALLBACKS) : NULL;
	if (!cb || cb->struct_size < sizeof *cb || !cb->GetModuleFunctionTable) return 0;
	static const int core[] = {CORE_MarkEx, CORE_MarkA, CORE_RangeStartEx, CORE_RangeStartA,
	                           CORE_RangeEnd, CORE_RangePushEx, CORE_RangePushA, CORE_RangePop};
	nvtx_fn const core_fns[] = {(nvtx_fn)markEx, (nvtx_fn)markA, (nvtx_fn)startEx, (nvtx_fn)startA,
	                            (nvtx_fn)end, (nvtx_fn)pushEx, (nvtx_fn)pushA, (nvtx_fn)popCore};
	fill(cb, NVTX_CB_MODULE_CORE, core, core_fns, sizeof core / sizeof core[0]);
	static const int core2[] = {CORE2_DomainMarkEx, CORE2_DomainRangeStartEx, CORE2_DomainRangeEnd,
	                            CORE2_DomainRangePushEx, CORE2_DomainRangePop, CORE2_DomainRegisterStringA,
	                            CORE2_DomainCreateA};
	nvtx_fn const core2_fns[] = {(nvtx_fn)dmarkEx, (nvtx_fn)dstartEx, (nvtx_fn)dend, (nvtx_fn)dpushEx,
	                             (nvtx_fn)dpop, (nvtx_fn)dregister, (nvtx_fn)dcreate};
	fill(cb, NVTX_CB_MODULE_CORE2, core2, core2_fns, sizeof core2 / sizeof core2[0]);
	return 1;
}
