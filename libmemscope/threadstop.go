package libmemscope

/*
#include <stdint.h>
int ms_internal_tids(int32_t *out, int cap);
int ms_stop_signal(void);
int ms_threads_stop(const int32_t *tids, int n, int sig, int timeout_ms);
int ms_thread_regs(int i, uint64_t *regs, int cap, uint64_t *sp, int *nregs);
void ms_threads_resume(void);
*/
import "C"

import (
	"syscall"
	"unsafe"

	"msmemscope/internal/logx"
	"msmemscope/leakscan"
)

// stopTimeoutMS is how long the scan waits for the threads it signals to
// answer (threadstop.c).
const stopTimeoutMS = 100

// stoppedThreads are the program's other threads as the scan holds them.
type stoppedThreads struct {
	regs []uint64 // every stopped thread's registers
	sps  []uint64 // their stacks' lowest live addresses
	tids map[int]bool
}

// stopThreads stops the program's threads other than the calling one and
// msmemscope's own, and reads their registers; resumeThreads must follow.
// A thread that blocks the signal, does not answer in time or is busy
// inside msmemscope is not held: its stack is read as before (from the stack
// pointer the kernel reports for a system call, else whole), without its
// registers.
func stopThreads() stoppedThreads {
	st := stoppedThreads{tids: map[int]bool{}}
	sig := int(C.ms_stop_signal())
	if sig == 0 {
		logx.Infof("leak kinds: no real-time signal free to stop threads: their registers are not read")
		return st
	}
	skip := map[int]bool{syscall.Gettid(): true}
	buf := make([]int32, 1024)
	n := int(C.ms_internal_tids((*C.int32_t)(unsafe.Pointer(&buf[0])), C.int(len(buf))))
	for _, t := range buf[:n] {
		skip[int(t)] = true
	}
	var tids []int32
	blocked := 0
	for _, tid := range leakscan.Tasks() {
		switch {
		case skip[tid]:
		case leakscan.SignalBlocked(tid, sig):
			blocked++
		default:
			tids = append(tids, int32(tid))
		}
	}
	if len(tids) == 0 {
		if blocked > 0 {
			logx.Infof("leak kinds: %d threads block signal %d: their registers are not read", blocked, sig)
		}
		return st
	}
	C.ms_threads_stop((*C.int32_t)(unsafe.Pointer(&tids[0])), C.int(len(tids)), C.int(sig), stopTimeoutMS)
	var regs [32]uint64
	busy, late := 0, 0
	for i, tid := range tids {
		var sp C.uint64_t
		var nregs C.int
		switch C.ms_thread_regs(C.int(i), (*C.uint64_t)(unsafe.Pointer(&regs[0])), C.int(len(regs)), &sp, &nregs) {
		case 1:
			st.regs = append(st.regs, regs[:nregs]...)
			st.sps = append(st.sps, uint64(sp))
			st.tids[int(tid)] = true
		case 2:
			busy++
		case 3:
			late++
		}
	}
	logx.Infof("leak kinds: %d threads stopped with signal %d; not: %d blocking it, %d inside msmemscope, %d not answering in %d ms (their stacks read as without stopping, their registers not)",
		len(st.sps), sig, blocked, busy, late, stopTimeoutMS)
	return st
}

// resumeThreads lets the stopped threads go on.
func resumeThreads() { C.ms_threads_resume() }
