// The hot path's shared definitions: the event records (8-byte units) that rings and
// the spool hold, and the functions the Go engine calls. Keep in sync with
// spool/spool.go, which reads these records.
#ifndef MEMSCOPE_HOOK_H
#define MEMSCOPE_HOOK_H

#include <stdint.h>
#include <stddef.h>

// The spool and the rings are sequences of 8-byte units. An event is either
// a full record (4 units, then n continuation units holding its payload:
// stack frames or text), or, for the hot path, a compact record: MALLOC in
// 2 units {ptr | tag << 48, size | site << 48}, FREE in 1 unit {ptr | tag << 48},
// or a short MALLOC in 1 unit (C_SHORT) when its site is that of the thread's
// previous MALLOC: {C_COMPACT | C_SHORT | F_OFF? << 60 | size << 43 | ptr >> 4},
// flags F_HOST (| F_OFF), size < 2^17, ptr 16-byte aligned below 2^47;
// a MALLOC with a C stack already written (F_STACKID in its flags) is the
// 2-unit form plus a unit holding the stack's id. Two hot events that are
// small and near the thread's last address share a pair unit (C_PAIR below).
// The top bit of an event's first unit tells them apart (a full record's
// first unit ends with its kind, always < 0x8000). A compact record carries
// no stamp: its time is interpolated within the thread's current epoch (the
// last R_EPOCH before it). Keep in sync with spool/spool.go.
typedef struct {
	uint32_t n; // continuation units that follow (low 16 bits); a MALLOC's site id (high 16)
	uint16_t flags;
	uint16_t kind; // R_*
	uint64_t ts;   // TSC ticks or ns (see R_CALIB), or TS_EPOCH | epoch
	uint64_t a;    // ptr, mstx id, child pid, calib ns
	uint64_t b;    // size, payload length in bytes
} ms_rec;

#define REC_UNITS 4 // sizeof(ms_rec) / 8
#define C_COMPACT (1ull << 63)
#define C_FREE (1ull << 62)
#define C_SHORT (1ull << 61) // a MALLOC's first unit: the short form (flag 0x2000 is never used)
#define C_SHORT_OFF (1ull << 60)
#define C_SHORT_SIZE (1ull << 17) // sizes below this fit a short MALLOC
#define C_FLAGS 0x1fffull // a compact record's flags (bits 48-60)
#define C_MAX ((1ull << 48) - 1)
// A pair unit: two hot events of 29 bits each, the older in bits 32-60, the
// newer in bits 0-28 with P_SECOND set (bits 0-31 zero: no second event).
// Each gives its address relative to the thread's previous compact record's
// (ptr - last) >> 4, two's complement: a FREE in 28 bits; a MALLOC (P_MALLOC,
// at the thread's last MALLOC site, F_HOST only) its size (< P_MSIZE) from
// bit P_MSHIFT and the address in the 17 bits below.
#define C_PAIR (C_COMPACT | C_FREE | C_SHORT)
#define P_SECOND (1u << 31)
#define P_MALLOC (1u << 28)
#define P_MSHIFT 17
#define P_MSIZE (1u << 11)
#define P_MNEAR (1ll << 20) // a MALLOC half's address lies within +-P_MNEAR bytes of the last
#define P_FNEAR (1ll << 31) // a FREE half's

enum {
	R_MALLOC = 1,
	R_FREE = 2,
	R_MARK = 3,
	R_RSTART = 4,
	R_REND = 5,
	R_START = 6,
	R_STOP = 7,
	R_STEP = 8,
	R_EXIT = 9,
	R_CALIB = 10, // ts = tick, a = CLOCK_MONOTONIC ns, b = epoch (F_EPOCH: the epoch starts here)
	R_EXEC = 11,  // payload: program path
	R_FORK = 12,  // a = child pid
	R_LOST = 13,  // a = events lost
	R_SITE = 14,  // a = allocation site (return address), b = its id (the upper half of a MALLOC's n)
	R_EPOCH = 15, // ts = TS_EPOCH | epoch: this thread's compact records that follow belong to it
	R_STACK = 16, // a = stack id, b = frames; payload: the C stack's return addresses (see F_STACKID)
	// Python (pystack.c, libmemscope/api.go)
	R_PYCODE = 32,     // a = code id; payload: ms_pycode + file, name, qualname, line table
	R_PYSKIP = 33,     // payload: a folder whose Python frames are msmemscope's own
	R_CONFIG = 34,     // payload: the effective configuration (JSON) from now on
	R_DESCRIBE = 35,   // a = address; payload: owner tag (msmemscope.describe(obj, owner=))
	R_OWNER_PUSH = 36, // payload: owner tag of a describe scope entered by this thread
	R_OWNER_POP = 37,  // the thread left its innermost describe scope
	// PyTorch (python/msmemscope/torch_hooks.py, through msmemscope_torch_event)
	R_OP_START = 40, // a = launch index; payload: operator name, then its READ accesses (text lines)
	R_OP_END = 41,   // a = launch index; payload: operator name, then its WRITE accesses
	R_SNAPSHOT = 42, // payload: attrs "k:v,k:v" (host rss and heap; torch.cuda stats)
	R_WATCH = 43,    // a = launch index; payload: watch result line (see spool/torch.go)
	R_TAG = 44,      // a = a tensor storage's address; payload: owner category (weight, gradient…)
};

// flags
#define F_SUB_MASK 0x000f // subtype of MALLOC/FREE
#define F_HOST 0x0001
#define F_MMAP 0x0002
#define F_OFF 0x0010   // recorded while collection was switched off
#define F_CSTACK 0x0020 // payload: return addresses
#define F_TEXT 0x0040   // payload: text
#define F_UNDO 0x0080   // MALLOC: a failed realloc; the block just freed lives on
#define F_PYSTACK 0x0100 // MALLOC: payload has a Python stack (see pystack.h)
#define F_EPOCH 0x0001  // R_CALIB: a drain epoch starts at this point
#define F_INHERIT 0x0200 // MALLOC: a block live when this rotated log began (allocated earlier)
#define F_STACKID 0x0400 // MALLOC with F_CSTACK: payload is one unit, the id of an R_STACK

// Spool chunk header: nunit units of one thread follow.
typedef struct {
	uint32_t magic; // MS_CHUNK_MAGIC
	uint32_t nunit;
	int32_t tid;
	int32_t pid;
} ms_chunk;

#define MS_CHUNK_MAGIC 0x4b4e4843u // "CHNK"
#define MS_PAD_MAGIC 0x43444150u   // "PADC": a padding chunk (direct I/O alignment): skip nunit units

// Called by the Go engine.
void ms_set_spool(int fd);
long ms_drain(void);          // writes pending events; returns bytes written, -1 on error
long ms_drain_into(void *buf, long cap); // the same into memory (rotating logs)
int ms_drainer_start(void);    // the drain thread: ms_drain every 1-8 ms (spool mode)
uint64_t ms_drainer_stop(void); // stops it; returns the failed passes
void ms_finish(void);         // PROCESS_EXIT, final drain, then direct writes
int ms_finish_begin(void);    // ms_finish without its drain (rotating logs drain into memory); 0 in a child
void ms_calibrate(void);      // adds a clock calibration point to the spool
int ms_pid(void);
uint64_t ms_lost(void);
uint64_t ms_forks(void);
int ms_is_child(void);
void ms_guard_enter(void);
void ms_guard_leave(void);
void ms_fast_update(void); // after changing what the hot path records
void ms_set_rotating(int on); // rotating logs: no short MALLOCs or stack ids (each log is read alone)

#endif
