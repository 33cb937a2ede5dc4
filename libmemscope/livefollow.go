package libmemscope

/*
#include "hook.h"
*/
import "C"

import (
	"runtime"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"msmemscope/internal/logx"
	"msmemscope/leakscan"
)

// The exit scan's live set, kept as the run goes (the spool's chunks are
// counted as they arrive, leakscan.Live): at exit only what came since the
// last pass is read, not the whole spool. The goroutine runs on a thread of
// its own at idle CPU and I/O priority: it takes only what the program
// leaves. It begins after followDelay: a short run's spool is read at exit
// in a fraction of a second, and following it cost its whole command ~9%
// (reading back, while the drain writes, what the drain just wrote).

var follow struct {
	mu   sync.Mutex
	live *leakscan.Live // nil once the exit scan took it
	done bool
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
// on it: the leaks analysis asked, the library loaded before main (so the
// scan is armed), full mode (rotating logs keep their own live set).
func startLiveFollower(path string) {
	if eng.rot != nil || C.ms_late_armed() == 0 || !slices.Contains(eng.cfg.Analysis, "leaks") {
		return
	}
	l, err := leakscan.OpenLive(path)
	if err != nil {
		return // the exit scan reports it
	}
	follow.live = l
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		_ = unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
		_, _, _ = unix.Syscall(unix.SYS_IOPRIO_SET, 1 /* IOPRIO_WHO_PROCESS: this thread */, 0, ioprioIdle)
		for wait := followDelay; ; wait = followInterval {
			time.Sleep(wait)
			follow.mu.Lock()
			if follow.done {
				follow.mu.Unlock()
				return
			}
			_ = follow.live.Update() // (an error: the exit scan's own read says it)
			follow.mu.Unlock()
		}
	}()
}

// liveBlocks returns the HOST blocks live in the spool at path now, and
// stops the follower.
func liveBlocks(path string) ([]leakscan.Block, error) {
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
