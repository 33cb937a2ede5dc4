package libmemscope

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"msmemscope/analyzer"
	"msmemscope/internal/logx"
	"msmemscope/livesites"
	"msmemscope/spool"
	"msmemscope/trace"
)

// The live per-site memory report (SPEC §7): what is allocated now, and
// where; and the peak timeline of a finished capture. capi/ exports these
// behind C shims that refuse in a forked child and keep the calling
// thread's allocations out of the capture.

// MemReport is the live report: {"total_size": N, "mem_report": [{"site",
// "function", "size", "count"}…]}, largest first. It drains the rings and
// reads what the spool gained since the last call (livesites): the sum of
// the sites' sizes is the live bytes of the event stream at this moment.
// Rotating logs cannot be followed as they grow: there the kept logs are
// replayed.
func MemReport() (analyzer.MemReport, error) {
	eng.mu.Lock()
	dir, started, rotating := "", eng.started && !eng.finished, eng.rot != nil
	if started {
		dir = eng.proc.Dir
		drainNow()
	}
	eng.mu.Unlock()
	if !started {
		return analyzer.MemReport{Report: []analyzer.SiteSize{}}, nil
	}
	if rotating {
		return replayReport(dir)
	}
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.s == nil {
		t, err := spool.OpenTail(filepath.Join(dir, spool.SpoolDir, spool.FileName))
		if err != nil {
			return analyzer.MemReport{}, err
		}
		rep.s = livesites.New(t, func(uint16) bool { return true }, false)
	}
	before := rep.s.Offset()
	if err := rep.s.CatchUp(); err != nil {
		return analyzer.MemReport{}, err
	}
	logx.Infof("get_mem_report: read %d new bytes of the spool's %d", rep.s.Offset()-before, rep.s.Offset())
	return rep.s.Report(), nil
}

// rep is get_mem_report's state: every block of the capture, by site.
var rep struct {
	mu sync.Mutex
	s  *livesites.Set
}

// replayReport reads the capture from its start.
func replayReport(dir string) (analyzer.MemReport, error) {
	maps, _ := os.ReadFile("/proc/self/maps")
	s, closeFn, err := spool.OpenStreamMaps(dir, string(maps))
	if err != nil {
		return analyzer.MemReport{}, err
	}
	defer closeFn()
	live := analyzer.NewLiveSet()
	if err := trace.Each(s, func(e *trace.Event) error { live.Observe(e); return nil }); err != nil {
		return analyzer.MemReport{}, err
	}
	return live.Report(), nil
}

// AllTimeSize is [[t_ms, max_live_bytes], ...] for input: a capture or
// output folder, a dump CSV or DB, a spool or rotated log.
func AllTimeSize(input string, intervalMs int) (any, error) {
	if intervalMs < 1 {
		return nil, fmt.Errorf("interval_ms must be at least 1, not %d", intervalMs)
	}
	tl, err := analyzer.TimelineOf(input, uint64(intervalMs))
	if err != nil {
		return nil, err
	}
	return tl.Sizes(), nil
}

// ReportWithTime is the per-site report (as MemReport) at the maximum of
// the interval holding tMs.
func ReportWithTime(input string, tMs int64, intervalMs int) (any, error) {
	if intervalMs < 1 || tMs < 0 {
		return nil, fmt.Errorf("need t_ms >= 0 and interval_ms >= 1")
	}
	return analyzer.ReportAtTime(input, nil, uint64(intervalMs), uint64(tMs))
}
