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
// its own at idle priority: it takes only CPU time the program leaves.

var follow struct {
	mu   sync.Mutex
	live *leakscan.Live // nil once the exit scan took it
	done bool
}

// followInterval is how often the follower reads the spool's new chunks.
const followInterval = 100 * time.Millisecond

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
		for {
			time.Sleep(followInterval)
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
