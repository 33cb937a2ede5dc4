package libmemscope

/*
#include <stdlib.h>
#include "hook.h"
*/
import "C"

import (
	"encoding/json"
	"os"
	"sync"

	"msmemscope/analyzer"
	"msmemscope/capture"
)

// The live per-site memory report (SPEC §7): what is allocated now, and where.
var report struct {
	mu     sync.Mutex
	cached string // a report too large for the caller's buffer, kept for the retry
}

// memReport drains the rings and replays the capture so far: the sum of the
// sites' sizes is the live bytes of the event stream at this moment.
func memReport() (string, error) {
	eng.mu.Lock()
	dir, started := "", eng.started
	if started {
		dir = eng.proc.Dir
	}
	eng.mu.Unlock()
	if !started {
		b, _ := json.Marshal(analyzer.MemReport{Report: []analyzer.SiteSize{}})
		return string(b), nil
	}
	C.ms_drain()
	maps, _ := os.ReadFile("/proc/self/maps")
	s, closeFn, err := capture.OpenStreamMaps(dir, string(maps))
	if err != nil {
		return "", err
	}
	defer closeFn()
	live := analyzer.NewLiveSet()
	for {
		e, err := s.Next()
		if err != nil {
			return "", err
		}
		if e == nil {
			break
		}
		live.Observe(e)
	}
	b, err := json.Marshal(live.Report())
	return string(b), err
}

// msmemscope_get_mem_report puts the live report as JSON
// ({"total_size": N, "mem_report": [{"site", "function", "size", "count"}…]},
// largest first) in buf. Returns its length; when that is n or more, call
// again with a larger buffer to get the same report. -1 on error (the
// message is in buf).
//
//export msmemscope_get_mem_report
func msmemscope_get_mem_report(buf *C.char, n C.int) C.int {
	C.ms_guard_enter() // allocations made here are msmemscope's own
	defer C.ms_guard_leave()
	report.mu.Lock()
	defer report.mu.Unlock()
	s := report.cached
	report.cached = ""
	if s == "" {
		var err error
		if s, err = memReport(); err != nil {
			putString(buf, n, err.Error())
			return -1
		}
	}
	if len(s) >= int(n) {
		report.cached = s
	}
	putString(buf, n, s)
	return C.int(len(s))
}
