package libmemscope

/*
#include "hook.h"
*/
import "C"

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"msmemscope/internal/logx"
	"msmemscope/leakscan"
)

// The exit scan's live set, kept as the run goes (the spool's chunks are
// counted as they arrive, leakscan.Live): at exit only what came since the
// last pass is read, not the whole spool. The goroutine runs on a thread of
// its own at idle CPU priority (and idle I/O class, which BFQ honours). It
// begins after followDelay: a short run's spool is read at exit in a
// fraction of a second, and following it from the start cost the
// microbenchmark's whole command ~9% (reading back, while the drain writes,
// what the drain just wrote). At exit it is told to stop between two chunks
// (stop), so the scan never waits for an idle-priority thread's backlog: the
// rest is read at the exit's own priority.

var follow struct {
	mu   sync.Mutex
	live *leakscan.Live // nil until the first pass, and once the exit scan took it
	done bool
	stop atomic.Bool
}

// followDelay is when the follower first reads the spool, followInterval
// how often after that.
const (
	followDelay    = 2 * time.Second
	followInterval = 100 * time.Millisecond
)

// ioprioIdle is the idle I/O class for ioprio_set (linux/ioprio.h).
const ioprioIdle = 3 << 13

// startLiveFollower follows the spool at path when the exit scan will run
// on it: the leaks analysis asked, full mode (rotating logs keep their own
// live set), and the library loaded before main (so the scan is armed:
// checked when the follower wakes, as Go's start-up runs beside main's).
func startLiveFollower(path string) {
	if eng.rot != nil || !slices.Contains(eng.cfg.Analysis, "leaks") {
		return
	}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		_ = unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
		_, _, _ = unix.Syscall(unix.SYS_IOPRIO_SET, 1 /* IOPRIO_WHO_PROCESS: this thread */, 0, ioprioIdle)
		time.Sleep(followDelay)
		if C.ms_late_armed() == 0 {
			return
		}
		for {
			follow.mu.Lock()
			if follow.done {
				follow.mu.Unlock()
				return
			}
			if follow.live == nil {
				l, err := leakscan.OpenLive(path)
				if err != nil {
					follow.mu.Unlock()
					return // the exit scan reads the spool itself
				}
				follow.live = l
			}
			_ = follow.live.UpdateUntil(&follow.stop) // (an error: the exit scan's read meets it too)
			follow.mu.Unlock()
			time.Sleep(followInterval)
		}
	}()
}

// liveBlocks returns the HOST blocks live in the spool at path now, and
// stops the follower.
func liveBlocks(path string) ([]leakscan.Block, error) {
	follow.stop.Store(true) // a pass under way ends at its next chunk
	follow.mu.Lock()
	defer follow.mu.Unlock()
	follow.done = true
	l := follow.live
	follow.live = nil
	if l == nil {
		return leakscan.LiveFromSpool(path)
	}
	defer l.Close()
	before := l.Offset()
	if err := l.Update(); err != nil {
		return nil, err
	}
	logx.Infof("leak kinds: %d of the spool's %d bytes were read as the run went", before, l.Offset())
	return l.Blocks(), nil
}
