// Package collect is the conversion of a capture: its spool decoded into
// events, the analyses fed, and the dump, config.json and the analyses'
// reports written. Each row is written once: an analysis that annotates
// rows has decided about them before they are written.
package collect

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"msmemscope/analyzer"
	"msmemscope/config"
	"msmemscope/export"
	"msmemscope/internal/logx"
	"msmemscope/internal/safefs"
	"msmemscope/internal/version"
	"msmemscope/spool"
	"msmemscope/trace"
)

// Options tune a conversion.
type Options struct {
	Console io.Writer      // where the short summaries go; nil: nowhere
	Config  *config.Config // overrides the recorded configuration (offline --analysis)
	// TracedChildren are pids of processes of the same run that have a folder
	// of their own: forks of this image that exec'd and so were traced.
	TracedChildren map[int]bool
	// MapsFile symbolizes C stacks with these mappings (a capture still
	// running, converted by stop()); default spool/maps.end.txt, else
	// spool/maps.start.txt.
	MapsFile string
	// KeepLogs is the conversion at the exit of a run with rotating logs:
	// the logs are its record, within their bound on disk, so no dump is
	// written (the analyses run; config.json counts the rows the logs hold
	// as events_not_written's spool.NotWrittenInLogs). --input= on the
	// capture writes the dump.
	KeepLogs bool
}

// Result says what a conversion wrote and found.
type Result struct {
	Dir       string
	Meta      *spool.ProcessMeta
	DumpPath  string
	Events    uint64 // events decoded from the spool
	Rows      uint64 // rows written to the dump
	Lost      uint64
	Unwritten map[string]uint64 // events that made no row, by reason
	Order     spool.OrderStats
	Late      uint64 // rotating logs: records that reached the rotator after their log's cut settled
	Deleted   uint64 // rotating logs: the events the logs deleted held
	Complete  bool   // the image ended normally (not killed), its spool whole
	// DrainErrors counts the spool's writes that failed during the run.
	DrainErrors uint64
	Ended       string // how: spool.EndedExit, EndedQuick, EndedCrash, EndedExec or EndedKilled
	Crash       *spool.CrashMeta
	Exec        string // the program this image exec'd into, if any
	Forks       []int  // children forked by this image
	Untraced    int    // forked children that were not traced
	Truncated   bool
	Leaks       *analyzer.LeakReport
	LeaksPath   string

	Decompose     *analyzer.DecomposeReport
	DecomposePath string
	Inefficient   *analyzer.IneffReport
	WatchPath     string
	DeviceSeen    bool                 // a row of a device (not the host heap)
	OOMPath       string               // the report of CUDA allocations refused (oom.go)
	ExportPaths   []string             // the files --export wrote (package export)
	Reports       []*export.ProcReport // --export=html: this process's part of the run's report
}

// ConfigJSON is the config.json of SPEC §2.
type ConfigJSON struct {
	Version        string        `json:"version"`
	Config         config.Config `json:"config"`
	Pid            int           `json:"pid"`
	Ppid           int           `json:"ppid"`
	Cmdline        []string      `json:"cmdline"`
	Clock          string        `json:"clock"`
	UnixOffsetNs   int64         `json:"clock_unix_offset_ns"` // add to Timestamp(ns) for Unix time
	EventsRecorded uint64        `json:"events_recorded"`
	EventsWritten  uint64        `json:"events_written"`
	EventsLost     uint64        `json:"events_lost"`
	// Events that made no row, by reason: events_recorded = events_written
	// + events_lost + these.
	EventsNotWritten map[string]uint64 `json:"events_not_written"`
	// What ordering the threads' events took (see README, "Order").
	Order spool.OrderStats `json:"order"`
	// Rotating logs: MALLOCs and FREEs that came after their log's cut had
	// settled; a log read alone may be inexact about their blocks.
	RotateLate uint64 `json:"rotate_late,omitempty"`
	// Rotating logs: the events the logs deleted during the run held (not
	// in events_recorded, which counts what the logs kept hold).
	EventsInDeletedLogs    uint64           `json:"events_in_deleted_logs,omitempty"`
	ForkedChildrenUntraced int              `json:"forked_children_untraced"`
	DrainErrors            uint64           `json:"spool_write_errors,omitempty"` // writes to the spool that failed (the capture ends short)
	Complete               bool             `json:"complete"`
	Ended                  string           `json:"ended"` // exit, crash (the final drain ran in a crash handler), exec or killed
	Crash                  *spool.CrashMeta `json:"crash,omitempty"`
	Exec                   string           `json:"exec,omitempty"`
	SpoolBytes             int64            `json:"spool_bytes"`
}

// Convert turns the spool of a process folder into the dump, config.json and
// the analyses' reports.
//
// The analyses that only read rows are fed every decoded row while the dump
// is written (--steps filters the dump, not what they see). One that
// annotates rows (inefficient: its results go into the MALLOC rows, SPEC
// §5.3) must have judged a block before its MALLOC row is written, and a
// block may be judged only at its FREE or at the end: it gets a pass of its
// own over the spool first (re-readable; without stacks, so cheap), fed
// the rows that will be written, and its results are added to the rows in
// the writing pass. What it keeps between the passes is 16 bytes per block
// found inefficient. (Holding rows back until their blocks are judged would
// not be bounded: a block alive to the end is judged at the end.) A spool
// without the rows it needs (no PyTorch records: no ACCESS rows) gets no
// first pass.
func Convert(dir string, opt Options) (*Result, error) {
	t0 := time.Now()
	meta, err := spool.ReadMeta(dir)
	if err != nil {
		return nil, BadInput(fmt.Errorf("%s is not a capture folder: %v", dir, err))
	}
	cfg := meta.Config
	if opt.Config != nil {
		cfg = *opt.Config
	}
	// end.json before the spool: a process still running may end while
	// the spool is opened, and its spool only grows (end.json's size is
	// then no more than what was opened).
	end := spool.ReadEnd(dir)
	if _, serr := os.Stat(filepath.Join(dir, spool.SpoolDir, spool.EndFile)); end == nil && serr == nil {
		// (read as a run that did not end normally: what its spool holds)
		logx.WarnTo(opt.Console, "%s: %s cannot be read (damaged): the capture is read as a run that did not end normally", dir, filepath.Join(spool.SpoolDir, spool.EndFile))
	}
	sp, err := spool.OpenCaptureEnded(dir, end)
	if err != nil {
		return nil, BadInput(err)
	}
	defer sp.Close()
	for _, cut := range sp.CutLogs {
		// A kill cuts the logs being written; an older log cut so was
		// damaged (or copied short): what it held past there is not read.
		logx.WarnTo(opt.Console, "%s: read up to its last whole frame", cut)
	}
	if opt.Config == nil && sp.Py.Config != "" {
		// msmemscope.config() changed the configuration while running.
		if c, err := config.Decode(sp.Py.Config); err == nil {
			c.Output = cfg.Output
			cfg = c
		}
	}
	res := &Result{Dir: dir, Meta: meta, Truncated: sp.Truncated}
	res.Crash = spool.ReadCrash(dir)
	res.Ended = spool.Ended(end, res.Crash)
	quick := res.Ended == spool.EndedQuick // by _exit: the final drain ran, as at exit
	if end != nil {
		// Writes to the spool failed during the run (a full disk): it
		// ends short where they began, as a killed run's does.
		res.DrainErrors = end.DrainErrors
	}
	drainFailed := res.DrainErrors > 0 // (OpenCaptureEnded judged the spool by end)
	res.Complete = (end != nil || quick) && !drainFailed

	dumpDir := filepath.Join(dir, spool.DumpDir)
	if err := safefs.EnsureDir(dumpDir); err != nil {
		return nil, err
	}
	stamp := safefs.Stamp(time.Now())
	ext := ".csv"
	if cfg.DataFormat == trace.FormatDB {
		ext = ".db"
	}
	noDump := opt.KeepLogs && len(spool.LogFiles(dir)) > 0
	if !noDump {
		res.DumpPath = uniquePath(filepath.Join(dumpDir, "memscope_dump_"+stamp), ext)
	}

	torch, err := spool.LearnTorch(sp, dir, meta, cfg)
	if err != nil {
		return nil, BadInput(err)
	}
	input := res.DumpPath // what the analyses' reports name as their input
	if noDump {
		input = dir
	}
	runs, err := newRuns(cfg.Analysis, input)
	if err != nil {
		return nil, err
	}
	written := func(e *trace.Event) bool { return e.Kind == trace.KindSystem || cfg.WantStep(e.Step) }
	if judgeFirst(runs, sp.Holds) {
		first := newDecoder(sp, dir, meta, cfg, opt.MapsFile, torch)
		first.JudgeOnly()
		err := eachEvent(inputNext(first.NextInto), nil, nil, func(e *trace.Event) error {
			if written(e) {
				observe(runs, true, e)
			}
			return nil
		})
		if err == nil {
			err = finish(runs, true)
		}
		if err != nil {
			return nil, err
		}
	}

	if est := dumpEstimate(sp, cfg); est > 1<<30 && opt.Console != nil && !noDump {
		fmt.Fprintf(opt.Console, "msmemscope: %s: writing a dump of about %s\n", res.DumpPath, safefs.HumanBytes(est))
	}
	dec := newDecoder(sp, dir, meta, cfg, opt.MapsFile, torch)
	var outside uint64
	maxStep := 0 // the latest step the capture began
	var oom oomWatch
	exp, err := export.NewSet(cfg.Export)
	if err != nil {
		return nil, err
	}
	exp.SetProcess(int64(meta.Pid))
	exp.SetCommand(meta.Cmdline)
	write := WriteDump
	var inLogs countRows
	if noDump {
		write = func(_ string, _ DumpOptions, fill func(RowWriter) error) (uint64, error) {
			return 0, fill(&inLogs)
		}
	}
	res.Rows, err = write(res.DumpPath, DumpOptions{Format: cfg.DataFormat, Pid: int64(meta.Pid), PythonTraces: pythonTraces(dumpDir)},
		func(w RowWriter) error {
			// The analyses that only read rows are fed on a goroutine
			// of their own, between the decoder and the formatters
			// (decodeBatches).
			pre := func(e *trace.Event) {
				if e.Device != "" && e.Device != trace.DeviceHost {
					res.DeviceSeen = true
				}
				oom.observe(e)
				maxStep = max(maxStep, e.Step)
				exp.Observe(e)
				observe(runs, false, e)
			}
			return writeEvents(inputNext(dec.NextInto), pre, func(e *trace.Event) bool {
				if !written(e) {
					outside++
					return false
				}
				annotate(runs, e)
				return true
			}, w)
		})
	if full := (*safefs.ErrReserve)(nil); errors.As(err, &full) {
		return nil, fmt.Errorf("%v; the capture is kept as it was: convert it again with --input=%s", err, dir)
	}
	if err != nil {
		return nil, err
	}
	setLeakKinds(runs, dec.LeakKinds())
	if meta.Config.HasDevice("cpu") && !cfg.HasDevice("cpu") {
		// config(device=...) without cpu stopped the host heap's recording:
		// blocks freed after that would read as alive, and as lost.
		setExitUnknown(runs, fmt.Sprintf("the host heap stopped being recorded during the run (device %s), so frees after that were not seen", strings.Join(cfg.Devices, ",")))
	}
	if drainFailed {
		why := fmt.Sprintf("%d of the spool's writes failed during the run (a full disk?), so the events from the first one on are missing", end.DrainErrors)
		if meta.Config.LogMode == "rotate" {
			// (the logs go on once the oldest went early: the failed
			// batches' events are missing, not all after them)
			why = fmt.Sprintf("%d of the rotated logs' writes failed during the run (a full disk?), so their events are missing", end.DrainErrors)
		}
		setExitUnknown(runs, why)
		logx.WarnTo(opt.Console, "process %d: %s", meta.Pid, why)
	}
	if err := finish(runs, false); err != nil {
		return nil, err
	}
	res.Unwritten, res.Order = dec.Unwritten(), dec.Order()
	if outside > 0 {
		res.Unwritten[spool.NotWrittenSteps] = outside
	}
	var never []string
	for _, id := range cfg.Steps {
		if id > maxStep {
			never = append(never, strconv.Itoa(id))
		}
	}
	if len(never) > 0 && err == nil {
		// (else an id mistyped reads as a step with nothing in it)
		logx.WarnTo(opt.Console, "process %d: --steps: step %s never began (the capture's last step is %d): no rows of it", meta.Pid, strings.Join(never, ", "), maxStep)
	}
	if inLogs.n > 0 {
		res.Unwritten[spool.NotWrittenInLogs] = inLogs.n
	}
	res.Lost = dec.Lost()
	if end != nil {
		res.Late, res.Deleted = end.RotateLate, end.RotateDeleted
	}
	if end != nil && end.Lost > res.Lost {
		res.Lost = end.Lost
	}
	if res.Crash != nil && res.Crash.Lost > res.Lost {
		res.Lost = res.Crash.Lost
	}
	res.Events = dec.Events() + res.Lost
	res.Exec = dec.Exec()
	if res.Exec != "" && res.Ended == spool.EndedKilled {
		res.Ended = spool.EndedExec
	}
	res.Forks = dec.Forks()
	for _, c := range res.Forks {
		if !opt.TracedChildren[c] {
			res.Untraced++
		}
	}

	cj := ConfigJSON{
		Version: version.Version, Config: cfg, Pid: meta.Pid, Ppid: meta.Ppid, Cmdline: meta.Cmdline,
		Clock: "CLOCK_MONOTONIC", UnixOffsetNs: meta.StartUnixNs - meta.StartMonoNs,
		EventsRecorded: res.Events, EventsWritten: res.Rows, EventsLost: res.Lost, EventsNotWritten: res.Unwritten,
		Order:                  res.Order,
		RotateLate:             res.Late,
		EventsInDeletedLogs:    res.Deleted,
		ForkedChildrenUntraced: res.Untraced, DrainErrors: res.DrainErrors, Complete: res.Complete, Ended: res.Ended, Crash: res.Crash, Exec: res.Exec, SpoolBytes: sp.Bytes,
	}
	cpath := filepath.Join(dir, spool.ConfigFile)
	if _, err := os.Stat(cpath); err == nil {
		// Named after the dump (memscope_dump_{key} -> config_{key}), so
		// that a reader finds the config that counts its rows (trace.Open).
		key := stamp
		if res.DumpPath != "" {
			key = strings.TrimSuffix(strings.TrimPrefix(filepath.Base(res.DumpPath), "memscope_dump_"), ext)
		}
		cpath = uniquePath(filepath.Join(dir, "config_"+key), ".json")
	}
	if err := safefs.WriteJSON(cpath, cj); err != nil {
		return nil, err
	}
	if err := writeReports(res, runs, stamp, cfg, dec.Watch(), opt.Console); err != nil {
		return nil, err
	}
	if err := oom.write(res, stamp, opt.Console); err != nil {
		return nil, err
	}
	exp.SetLeakKinds(leakKindOf(dec.LeakKinds()))
	exp.SetAnalyses(&export.Analyses{Leaks: res.Leaks, Inefficient: res.Inefficient, Decompose: res.Decompose})
	if res.ExportPaths, err = exp.Write(filepath.Join(dir, export.Dir), stamp); err != nil {
		return nil, err
	}
	res.Reports = exp.Reports()
	for _, p := range res.ExportPaths {
		if opt.Console != nil {
			fmt.Fprintf(opt.Console, "msmemscope: process %d (%s): export written to %s\n", meta.Pid, meta.ProgName(), p)
		}
	}
	for _, n := range exp.Notes() {
		logx.WarnTo(opt.Console, "process %d: %s", meta.Pid, n)
	}
	if w := DeviceWarning(cfg, res.DeviceSeen, cudaDriverLoaded(dir)); w != "" && cfg.LogLevel != "error" {
		logx.WarnTo(opt.Console, "process %d: %s", meta.Pid, w)
	}
	logx.InfoTo(opt.Console, "process %d: %d events -> %d rows in %.2f s (%s)", meta.Pid, res.Events, res.Rows,
		time.Since(t0).Seconds(), dir)
	return res, nil
}

// DeviceWarning says that a device named explicitly (not the default
// cpu,cuda) or --level=kernel found nothing to collect: no row of a device
// was made. driver: the CUDA driver was loaded in the process (a device
// was there, but none of its memory was allocated while collecting). "" when there is
// nothing to say.
func DeviceWarning(cfg config.Config, seen, driver bool) string {
	if seen {
		return ""
	}
	var named []string
	for _, d := range cfg.Devices {
		if d != "cpu" {
			named = append(named, d)
		}
	}
	explicit := !slices.Equal(cfg.Devices, config.Default().Devices)
	switch {
	case len(named) > 0 && explicit:
		host := ""
		if !cfg.HasDevice("cpu") {
			host = " (host-heap rows need --device=cpu)"
		}
		if driver {
			return fmt.Sprintf("--device=%s: the CUDA driver was loaded, but no memory of %s was allocated through it while collecting: no %s row was written%s", strings.Join(cfg.Devices, ","), strings.Join(named, ","), strings.Join(named, ","), host)
		}
		return fmt.Sprintf("--device=%s: no %s device was seen in this process, so no device memory was recorded%s", strings.Join(cfg.Devices, ","), strings.Join(named, ","), host)
	case cfg.Level == "kernel" && !driver:
		return "--level=kernel: no kernel launch was seen (kernels come from a CUDA device and none was seen in this process), and operators are collected only with --level=op"
	}
	return ""
}

// cudaDriverLoaded reports whether the process mapped the CUDA driver
// (libcuda), from the mappings the capture kept.
func cudaDriverLoaded(dir string) bool {
	for _, f := range []string{spool.MapsEnd, spool.MapsStart} {
		b, err := os.ReadFile(filepath.Join(dir, spool.SpoolDir, f))
		if err == nil {
			return bytes.Contains(b, []byte("/libcuda.so"))
		}
	}
	return false
}

// countRows counts the rows of a conversion that writes no dump (KeepLogs).
type countRows struct{ n uint64 }

func (c *countRows) Write(*trace.Event) error { c.n++; return nil }
func (c *countRows) Rows() uint64             { return c.n }

// dumpEstimate is a CSV dump's size to expect: without stacks a row is
// ~140 bytes; with them a row holds its stacks in full, which the spool
// keeps once, so the spool's size says more.
func dumpEstimate(sp *spool.Spool, cfg config.Config) uint64 {
	if cfg.PyStack == 0 && cfg.CStack == 0 {
		return sp.Records * dumpBytesPerRow
	}
	return uint64(sp.Bytes) * dumpBytesPerSpoolByte
}

// dumpBytesPerRow is a row's size without stacks (a MALLOC: ~135 bytes).
const dumpBytesPerRow = 140

// dumpBytesPerSpoolByte estimates a CSV dump's size from its spool's: an
// event takes ~8 bytes in the spool and ~150 as a row.
const dumpBytesPerSpoolByte = 18

// OrderWarning says what the merge of the threads' events could not settle
// (config.json's "order"), or "" when it settled everything: a FREE no
// MALLOC could precede, a MALLOC of an address whose FREE was never
// recorded, events whose order on their address the stamps left open.
func OrderWarning(res *Result) string {
	o := res.Order
	var msg string
	if o.UnpairedFree+o.LostFree+o.Ambiguous > 0 {
		msg = fmt.Sprintf("%d FREE(s) of memory no recorded MALLOC precedes, %d MALLOC(s) of an address whose FREE was never recorded, %d event(s) whose order on their address is ambiguous (config.json: order)",
			o.UnpairedFree, o.LostFree, o.Ambiguous)
	}
	if res.Late > 0 {
		if msg != "" {
			msg += "; "
		}
		msg += fmt.Sprintf("%d event(s) reached the rotating logs after their log's start had settled: a log read alone may be inexact about their blocks (config.json: rotate_late)", res.Late)
	}
	return msg
}

// uniquePath returns base+ext, or base_N+ext when that exists already.
func uniquePath(base, ext string) string {
	return safefs.FreeName(safefs.Numbered(base, ext))
}

// newDecoder decodes sp from its start, its C stacks symbolized with
// mapsFile (Options.MapsFile), its PyTorch records with what torch learnt:
// their rows as each range's configuration asked (a conversion's options
// never set events).
func newDecoder(sp *spool.Spool, dir string, meta *spool.ProcessMeta, cfg config.Config, mapsFile string, torch *spool.TorchInfo) *spool.Decoder {
	d := spool.NewDecoder(sp, dir, meta, cfg)
	d.SymbolizeWith(mapsFile, "")
	d.FollowConfig()
	d.UseTorch(torch)
	if len(cfg.Export) == 0 {
		d.NoSites() // no analysis of a conversion reads them (an export names blocks by site without stacks)
	}
	return d
}
