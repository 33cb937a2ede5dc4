package libmemscope

/*
#include <stdlib.h>
#include "hook.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"msmemscope/analyzer"
	"msmemscope/capture"
	"msmemscope/spool"
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
	dir, started := "", eng.started && !eng.finished
	if started {
		dir = eng.proc.Dir
		drainNow()
	}
	eng.mu.Unlock()
	if !started {
		b, _ := json.Marshal(analyzer.MemReport{Report: []analyzer.SiteSize{}})
		return string(b), nil
	}
	maps, _ := os.ReadFile("/proc/self/maps")
	s, closeFn, err := spool.OpenStreamMaps(dir, string(maps))
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

// timelineCache keeps a result too large for the caller's buffer for the
// retry with a larger one.
var timelineCache struct {
	mu       sync.Mutex
	key, val string
}

func cachedJSON(key string, buf *C.char, n C.int, compute func() (any, error)) C.int {
	C.ms_guard_enter()
	defer C.ms_guard_leave()
	timelineCache.mu.Lock()
	defer timelineCache.mu.Unlock()
	s := ""
	if timelineCache.key == key {
		s = timelineCache.val
		timelineCache.key, timelineCache.val = "", ""
	} else {
		v, err := compute()
		if err != nil {
			putString(buf, n, err.Error())
			return -1
		}
		b, err := json.Marshal(v)
		if err != nil {
			putString(buf, n, err.Error())
			return -1
		}
		s = string(b)
	}
	if len(s) >= int(n) {
		timelineCache.key, timelineCache.val = key, s
	}
	putString(buf, n, s)
	return C.int(len(s))
}

// msmemscope_get_all_time_size puts [[t_ms, max_live_bytes], ...] (JSON) for
// the capture at input (a capture folder, or an output folder holding one)
// in buf. Returns its length (call again with a larger buffer when that is n
// or more), -1 on error with the message in buf.
//
//export msmemscope_get_all_time_size
func msmemscope_get_all_time_size(input *C.char, intervalMs C.int, buf *C.char, n C.int) C.int {
	in := C.GoString(input)
	return cachedJSON("all\x00"+in+"\x00"+fmt.Sprint(intervalMs), buf, n, func() (any, error) {
		if intervalMs < 1 {
			return nil, fmt.Errorf("interval_ms must be at least 1, not %d", int(intervalMs))
		}
		dir, err := spool.FindCapture(in)
		if err != nil {
			return nil, err
		}
		tl, err := capture.Timeline(dir, uint64(intervalMs), 0)
		if err != nil {
			return nil, err
		}
		return tl.Sizes(), nil
	})
}

// msmemscope_get_mem_report_with_time puts the per-site report (JSON, as
// msmemscope_get_mem_report) at the maximum of the interval holding t_ms.
//
//export msmemscope_get_mem_report_with_time
func msmemscope_get_mem_report_with_time(input *C.char, tMs C.longlong, intervalMs C.int, buf *C.char, n C.int) C.int {
	in := C.GoString(input)
	return cachedJSON(fmt.Sprintf("at\x00%s\x00%d\x00%d", in, int64(tMs), int(intervalMs)), buf, n, func() (any, error) {
		if intervalMs < 1 || tMs < 0 {
			return nil, fmt.Errorf("need t_ms >= 0 and interval_ms >= 1")
		}
		dir, err := spool.FindCapture(in)
		if err != nil {
			return nil, err
		}
		return capture.ReportWithTime(dir, uint64(intervalMs), uint64(tMs))
	})
}
