package capture

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"msmemscope/analyzer"
	"msmemscope/config"
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
}

// Result says what a conversion wrote and found.
type Result struct {
	Dir       string
	Meta      *spool.ProcessMeta
	DumpPath  string
	Events    uint64 // events decoded from the spool
	Rows      uint64 // rows written to the dump
	Lost      uint64
	Complete  bool   // the image ended normally (not killed)
	Exec      string // the program this image exec'd into, if any
	Forks     []int  // children forked by this image
	Untraced  int    // forked children that were not traced
	Truncated bool
	Leaks     *analyzer.LeakReport
	LeaksPath string

	Decompose     *analyzer.DecomposeReport
	DecomposePath string
	WatchPath     string
}

// ConfigJSON is the config.json of SPEC §2.
type ConfigJSON struct {
	Version                string        `json:"version"`
	Config                 config.Config `json:"config"`
	Pid                    int           `json:"pid"`
	Ppid                   int           `json:"ppid"`
	Cmdline                []string      `json:"cmdline"`
	Clock                  string        `json:"clock"`
	UnixOffsetNs           int64         `json:"clock_unix_offset_ns"` // add to Timestamp(ns) for Unix time
	EventsRecorded         uint64        `json:"events_recorded"`
	EventsWritten          uint64        `json:"events_written"`
	EventsLost             uint64        `json:"events_lost"`
	ForkedChildrenUntraced int           `json:"forked_children_untraced"`
	Complete               bool          `json:"complete"`
	Exec                   string        `json:"exec,omitempty"`
	SpoolBytes             int64         `json:"spool_bytes"`
}

// Convert turns the spool of a process folder into the dump, config.json and
// the analyses' reports.
func Convert(dir string, opt Options) (*Result, error) {
	meta, err := spool.ReadMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not a capture folder: %v", dir, err)
	}
	cfg := meta.Config
	if opt.Config != nil {
		cfg = *opt.Config
	}
	sp, err := spool.OpenCapture(dir)
	if err != nil {
		return nil, err
	}
	defer sp.Close()
	if opt.Config == nil && sp.Py.Config != "" {
		// msmemscope.config() changed the configuration while running.
		if c, err := config.Decode(sp.Py.Config); err == nil {
			c.Output = cfg.Output
			cfg = c
		}
	}
	res := &Result{Dir: dir, Meta: meta, Truncated: sp.Truncated}
	end := spool.ReadEnd(dir)
	res.Complete = end != nil
	if res.Complete && sp.Truncated && len(spool.LogFiles(dir)) == 0 {
		// A process that ended normally flushed whole chunks: a cut-off
		// chunk means the file was damaged, not that the run was killed.
		return nil, fmt.Errorf("%s: the spool is corrupt (a chunk runs past the end of the file, though the process ended normally)", filepath.Join(dir, spool.SpoolDir, spool.FileName))
	}

	if err := safefs.EnsureDir(filepath.Join(dir, spool.DumpDir)); err != nil {
		return nil, err
	}
	stamp := Stamp(time.Now())
	ext := ".csv"
	if cfg.DataFormat == "db" {
		ext = ".db"
	}
	res.DumpPath = uniquePath(filepath.Join(dir, spool.DumpDir, "memscope_dump_"+stamp), ext)

	dec := spool.NewDecoder(sp, dir, meta, cfg)
	dec.SymbolizeWith(opt.MapsFile, "")
	if err := dec.DecodeTorch(); err != nil {
		return nil, err
	}
	leaks := analyzer.NewLeakAnalyzer()
	decomp := analyzer.NewDecomposeAnalyzer()
	writeEvents := func(dw dumpWriter) error {
		wantLeaks := cfg.HasAnalysis("leaks")
		wantDecomp := cfg.HasAnalysis("decompose")
		batches := decodeBatches(dec)
		defer func() {
			for range batches { // let the decoder finish if writing stopped early
			}
		}()
		for b := range batches {
			if b.err != nil {
				return b.err
			}
			for _, e := range b.events {
				if wantLeaks {
					leaks.Observe(e)
				}
				if wantDecomp {
					decomp.Observe(e)
				}
				if e.Kind == trace.KindSystem || cfg.WantStep(e.Step) {
					if err := dw.Write(e); err != nil {
						return err
					}
				}
			}
		}
		res.Rows = dw.Rows()
		return nil
	}
	if cfg.DataFormat == "db" {
		err = writeDB(res.DumpPath, filepath.Join(dir, spool.DumpDir), int64(meta.Pid), writeEvents)
	} else {
		err = safefs.WriteNew(res.DumpPath, func(w io.Writer) error {
			bw := bufio.NewWriterSize(w, 1<<20)
			cw := trace.NewCSVWriter(bw)
			if err := writeEvents(cw); err != nil {
				return err
			}
			if err := cw.Flush(); err != nil {
				return err
			}
			return bw.Flush()
		})
	}
	if err != nil {
		return nil, err
	}
	res.Events = dec.Records()
	res.Lost = dec.Lost()
	if end != nil && end.Lost > res.Lost {
		res.Lost = end.Lost
	}
	res.Exec = dec.Exec()
	res.Forks = dec.Forks()
	for _, c := range res.Forks {
		if !opt.TracedChildren[c] {
			res.Untraced++
		}
	}

	cj := ConfigJSON{
		Version: version.Version, Config: cfg, Pid: meta.Pid, Ppid: meta.Ppid, Cmdline: meta.Cmdline,
		Clock: "CLOCK_MONOTONIC", UnixOffsetNs: meta.StartUnixNs - meta.StartMonoNs,
		EventsRecorded: res.Events, EventsWritten: res.Rows, EventsLost: res.Lost,
		ForkedChildrenUntraced: res.Untraced, Complete: res.Complete, Exec: res.Exec, SpoolBytes: sp.Bytes,
	}
	cpath := filepath.Join(dir, spool.ConfigFile)
	if _, err := os.Stat(cpath); err == nil {
		cpath = uniquePath(filepath.Join(dir, "config_"+stamp), ".json")
	}
	if err := writeJSON(cpath, cj); err != nil {
		return nil, err
	}

	if cfg.HasAnalysis("inefficient") {
		// Results go into the dump's MALLOC rows (SPEC §5.3).
		r, err := analyzer.CheckInefficient(res.DumpPath, analyzer.IneffOptions{IdleThreshold: analyzer.DefaultIdleThreshold}, nil)
		if err != nil {
			return nil, err
		}
		if opt.Console != nil {
			fmt.Fprintf(opt.Console, "msmemscope: process %d (%s): %s", meta.Pid, progName(meta), r.Summary(5))
		}
	}
	if err := writeTorchReports(res, dir, stamp, cfg, dec.Watch(), decomp, opt.Console); err != nil {
		return nil, err
	}
	if cfg.HasAnalysis("leaks") {
		res.Leaks = leaks.Finish()
		if err := safefs.EnsureDir(filepath.Join(dir, spool.AnalysisDir)); err != nil {
			return nil, err
		}
		res.LeaksPath = uniquePath(filepath.Join(dir, spool.AnalysisDir, "leaks_"+stamp), ".csv")
		if err := safefs.WriteNew(res.LeaksPath, res.Leaks.WriteCSV); err != nil {
			return nil, err
		}
		if opt.Console != nil {
			fmt.Fprintf(opt.Console, "msmemscope: process %d (%s): %s", meta.Pid, progName(meta), res.Leaks.Summary(5))
		}
	}
	return res, nil
}

// dumpWriter is what the dump is written through: trace.CSVWriter or
// trace.SQLiteWriter (data_format csv or db).
type dumpWriter interface {
	Write(e *trace.Event) error
	Rows() uint64
}

// writeDB writes a SQLite dump (SPEC §2.2): the rows fill writes, then the
// python_trace CSVs found in dumpDir as table python_trace_{pid}.
func writeDB(path, dumpDir string, pid int64, fill func(dumpWriter) error) error {
	w, err := trace.CreateSQLite(path)
	if err != nil {
		return err
	}
	if err := fill(w); err != nil {
		w.Abort()
		return err
	}
	traces, _ := filepath.Glob(filepath.Join(dumpDir, "python_trace_*.csv"))
	for _, t := range traces {
		if err := w.AddPythonTrace(pid, t); err != nil {
			w.Abort()
			return fmt.Errorf("cannot write %s: %v", path, err)
		}
	}
	return w.Close()
}

// batch is a run of decoded events handed from the decoder to the writer.
type batch struct {
	events []*trace.Event
	err    error
}

// decodeBatches runs the decoder on its own goroutine, so decoding the spool
// and formatting the dump use both cores. The channel closes at the end (or
// after a batch carrying an error).
func decodeBatches(dec *spool.Decoder) <-chan batch {
	out := make(chan batch, 8)
	go func() {
		defer close(out)
		const size = 4096
		for {
			b := batch{events: make([]*trace.Event, 0, size)}
			for len(b.events) < size {
				e, err := dec.Next()
				if err != nil {
					b.err = err
					break
				}
				if e == nil {
					break
				}
				b.events = append(b.events, e)
			}
			if len(b.events) > 0 || b.err != nil {
				out <- b
			}
			if b.err != nil || len(b.events) < size {
				return
			}
		}
	}()
	return out
}

func progName(m *spool.ProcessMeta) string { return m.ProgName() }

// uniquePath returns base+ext, or base_N+ext when that exists already.
func uniquePath(base, ext string) string {
	return safefs.FreeName(safefs.Numbered(base, ext))
}
