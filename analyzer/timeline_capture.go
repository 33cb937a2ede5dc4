package analyzer

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync"

	"msmemscope/format"
	"msmemscope/internal/u64map"
	"msmemscope/spool"
	"msmemscope/trace"
)

// The peak timeline of a capture (SPEC §7: get_all_time_size,
// get_mem_report_with_time, msmemscope --timeline), for a plain spool or for
// rotating logs, which are parsed in parallel, one goroutine per file: each
// log is self-contained, so each gives the exact live bytes of its span.

// CaptureTimeline returns the local maximum of live bytes in each interval.
// workers <= 0 uses one goroutine per CPU.
func CaptureTimeline(dir string, intervalMs uint64, workers int) (*Timeline, error) {
	if intervalMs == 0 {
		return nil, fmt.Errorf("interval must be at least 1 ms")
	}
	if files := spool.LogFiles(dir); len(files) > 0 {
		tl, _, err := logTimeline(files, intervalMs, workers)
		return tl, err
	}
	s, closeFn, err := spool.OpenStream(dir)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	return BuildTimeline(s, intervalMs)
}

// CaptureReportAt returns the live bytes per site at the maximum of the
// interval holding tMs (ms from the timeline's start).
func CaptureReportAt(dir string, intervalMs, tMs uint64) (MemReport, error) {
	files := spool.LogFiles(dir)
	var tl *Timeline
	var spans []logSpan
	var err error
	if len(files) > 0 {
		tl, spans, err = logTimeline(files, intervalMs, 0) // the spans pick the log below
	} else {
		tl, err = CaptureTimeline(dir, intervalMs, 0)
	}
	if err != nil {
		return MemReport{}, err
	}
	if tMs/intervalMs >= uint64(len(tl.Points)) {
		return MemReport{}, fmt.Errorf("%d ms is past the end of the capture (%d ms)", tMs, uint64(len(tl.Points))*intervalMs)
	}
	target := tl.StartNs + tMs/intervalMs*intervalMs*1_000_000
	open := func() (trace.Stream, func() error, error) { return spool.OpenStream(dir) }
	if len(files) > 0 {
		// The log that reached the interval's maximum rebuilds its report.
		file, best := "", uint64(0)
		bucket := target / (intervalMs * 1_000_000)
		for _, sp := range spans {
			if bucket < sp.startBucket || bucket-sp.startBucket >= uint64(len(sp.max)) {
				continue
			}
			if m := sp.max[bucket-sp.startBucket]; file == "" || m >= best {
				file, best = sp.path, m
			}
		}
		if file == "" {
			return MemReport{}, fmt.Errorf("no kept log covers %d ms", tMs)
		}
		open = func() (trace.Stream, func() error, error) { return spool.OpenLogStream(dir, file) }
	}
	s, closeFn, err := open()
	if err != nil {
		return MemReport{}, err
	}
	local, err := BuildTimeline(s, intervalMs)
	closeFn()
	if err != nil {
		return MemReport{}, err
	}
	if target < local.StartNs {
		return MemReport{}, fmt.Errorf("no events at %d ms", tMs)
	}
	s, closeFn, err = open()
	if err != nil {
		return MemReport{}, err
	}
	defer closeFn()
	return local.ReportAt(s, (target-local.StartNs)/1_000_000)
}

type logSpan struct {
	path            string
	firstNs, lastNs uint64
	startBucket     uint64
	max             []uint64 // per interval from startBucket
	events          uint64
	err             error
}

// LogParseStats reports the work of the last parallel parse (for make bench).
type LogParseStats struct{ Files, Events uint64 }

// ParseLogs runs the parallel timeline over a rotating capture's logs and
// returns how many events it read (benchmarks compare worker counts).
func ParseLogs(dir string, intervalMs uint64, workers int) (LogParseStats, error) {
	files := spool.LogFiles(dir)
	_, spans, err := logTimeline(files, intervalMs, workers)
	st := LogParseStats{Files: uint64(len(files))}
	for _, s := range spans {
		st.Events += s.events
	}
	return st, err
}

func logTimeline(files []string, intervalMs uint64, workers int) (*Timeline, []logSpan, error) {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	step := intervalMs * 1_000_000
	spans := make([]logSpan, len(files))
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int, f string) {
			defer wg.Done()
			spans[i] = parseLog(f, step)
			<-sem
		}(i, f)
	}
	wg.Wait()
	tl := &Timeline{IntervalMs: intervalMs}
	first := true
	var start uint64
	for _, s := range spans {
		if s.err != nil {
			return nil, nil, s.err
		}
		if len(s.max) > 0 && (first || s.startBucket < start) {
			start, first = s.startBucket, false
		}
	}
	if first {
		return nil, nil, fmt.Errorf("the logs hold no events")
	}
	tl.StartNs = start * step
	var max []uint64
	for _, s := range spans {
		off := int(s.startBucket - start)
		for len(max) < off+len(s.max) {
			max = append(max, 0)
		}
		for j, v := range s.max {
			if v > max[off+j] {
				max[off+j] = v
			}
		}
	}
	for j, v := range max {
		tl.Points = append(tl.Points, TimePoint{Ms: uint64(j) * intervalMs, MaxLive: v})
	}
	return tl, spans, nil
}

type liveRec struct {
	size uint64
	tid  int32
}

// parseLog computes one log's per-interval maxima of live bytes from its raw
// records (no symbolization: fast), inherited blocks included.
func parseLog(path string, step uint64) logSpan {
	span := logSpan{path: path}
	open := spool.OpenLog
	if capture := filepath.Dir(filepath.Dir(path)); spool.ReadEnd(capture) != nil {
		open = spool.OpenWholeLog // the process ended: its logs were closed whole
	}
	sp, err := open(path)
	if err != nil {
		span.err = err
		return span
	}
	rd := sp.Reader()
	live := u64map.Map[liveRec]{Runs: true, Grain: 4} // by spool.BlockKey
	rd.SetLive(func(k spool.BlockKey) bool { return live.Has(uint64(k)) })
	var total uint64
	for {
		r, ns, err := rd.Next()
		if err != nil {
			span.err = err
			return span
		}
		if r == nil {
			break
		}
		span.events++
		if r.Kind != format.RMalloc && r.Kind != format.RFree {
			continue
		}
		bucket := ns / step
		if len(span.max) > 0 && bucket < span.startBucket {
			bucket = span.startBucket
		}
		if len(span.max) == 0 {
			span.startBucket, span.firstNs = bucket, ns
			span.max = append(span.max, total)
		}
		for uint64(len(span.max)) <= bucket-span.startBucket {
			span.max = append(span.max, total) // an interval starts at the level it inherits
		}
		span.lastNs = ns
		k := uint64(spool.KeyOf(r))
		if r.Kind == format.RMalloc {
			if r.Flags&format.FUndo != 0 {
				continue // a failed realloc: the block freed just before lives on
			}
			// msmemscope's own blocks and those allocated while collection
			// was off make no row: live at size 0, so that their FREEs pair
			// (the reader orders records by what is live).
			size := r.B
			if r.Flags&(format.FOwn|format.FOff) != 0 {
				size = 0
			}
			if old, ok := live.Get(k); ok {
				total -= old.size // its FREE was never recorded
			}
			live.Put(k, liveRec{size, r.Tid})
			total += size
		} else if old, ok := live.Take(k); ok {
			total -= old.size
		}
		if m := &span.max[bucket-span.startBucket]; total > *m {
			*m = total
		}
	}
	return span
}

// TimelineOf is the peak timeline of any input spool.Find takes: a capture
// from its spool (rotating logs parsed in parallel), anything else (a dump
// CSV or DB, a lone spool or log) from the stream spool.Open gives.
func TimelineOf(in string, intervalMs uint64) (*Timeline, error) {
	found, err := spool.Find(in)
	if err != nil {
		return nil, err
	}
	if found.HasSpool() {
		return CaptureTimeline(found.Capture, intervalMs, 0)
	}
	f, err := spool.Open(in, trace.OpenOptions{})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return BuildTimeline(f, intervalMs)
}

// ReportAtTime is the per-site report at the maximum of the interval
// holding tMs (ms from the timeline's start) of any input, as TimelineOf
// reads it; tl is that timeline when the caller has it already (else nil).
func ReportAtTime(in string, tl *Timeline, intervalMs, tMs uint64) (MemReport, error) {
	found, err := spool.Find(in)
	if err != nil {
		return MemReport{}, err
	}
	if found.HasSpool() {
		return CaptureReportAt(found.Capture, intervalMs, tMs)
	}
	if tl == nil {
		if tl, err = TimelineOf(in, intervalMs); err != nil {
			return MemReport{}, err
		}
	}
	f, err := spool.Open(in, trace.OpenOptions{})
	if err != nil {
		return MemReport{}, err
	}
	defer f.Close()
	return tl.ReportAt(f, tMs)
}
