// The hot path's shared definitions: the 32-byte event record that rings and
// the spool hold, and the functions the Go engine calls. Keep in sync with
// trace/spool.go, which reads these records.
#ifndef MEMSCOPE_HOOK_H
#define MEMSCOPE_HOOK_H

#include <stdint.h>
#include <stddef.h>

// One event. Variable-length payloads (stack frames, message text) follow as
// n continuation records of the same size.
typedef struct {
	uint64_t ts;   // TSC ticks or ns (see R_CALIB)
	uint64_t a;    // ptr, mstx id, child pid, calib ns
	uint64_t b;    // size, payload length in bytes
	uint16_t kind; // R_*
	uint16_t flags;
	uint32_t n; // continuation records that follow
} ms_rec;

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
	R_WATCH = 43,    // a = launch index; payload: watch result line (see capture/torch.go)
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

// Spool chunk header: nrec records of one thread follow.
typedef struct {
	uint32_t magic; // MS_CHUNK_MAGIC
	uint32_t nrec;
	int32_t tid;
	int32_t pid;
} ms_chunk;

#define MS_CHUNK_MAGIC 0x4b4e4843u // "CHNK"

// Called by the Go engine.
void ms_set_spool(int fd);
long ms_drain(void);          // writes pending events; returns bytes written, -1 on error
long ms_drain_into(void *buf, long cap); // the same into memory (rotating logs)
void ms_finish(void);         // PROCESS_EXIT, final drain, then direct writes
void ms_calibrate(void);      // adds a clock calibration point to the spool
int ms_pid(void);
uint64_t ms_lost(void);
uint64_t ms_forks(void);
int ms_is_child(void);
void ms_guard_enter(void);
void ms_guard_leave(void);

#endif
