package capture

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"msmemscope/analyzer"
	"msmemscope/analyzer/spec"
	"msmemscope/config"
	"msmemscope/internal/safefs"
	"msmemscope/internal/version"
	"msmemscope/symbolize"
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
	Meta      *ProcessMeta
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
	meta, err := ReadMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("%s is not a capture folder: %v", dir, err)
	}
	cfg := meta.Config
	if opt.Config != nil {
		cfg = *opt.Config
	}
	sp, err := openCaptureSpool(dir)
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
	end := readEnd(dir)
	res.Complete = end != nil
	if res.Complete && sp.Truncated && len(LogFiles(dir)) == 0 {
		// A process that ended normally flushed whole chunks: a cut-off
		// chunk means the file was damaged, not that the run was killed.
		return nil, fmt.Errorf("%s: the spool is corrupt (a chunk runs past the end of the file, though the process ended normally)", filepath.Join(dir, SpoolDir, trace.SpoolFileName))
	}

	if err := safefs.EnsureDir(filepath.Join(dir, DumpDir)); err != nil {
		return nil, err
	}
	stamp := Stamp(time.Now())
	ext := ".csv"
	if cfg.DataFormat == "db" {
		ext = ".db"
	}
	res.DumpPath = uniquePath(filepath.Join(dir, DumpDir, "memscope_dump_"+stamp), ext)

	dec := newDecoder(sp, dir, meta, cfg)
	dec.mapsFile = opt.MapsFile
	dec.torch = newTorchDec(cfg, false)
	if sp.HasTorch {
		if dec.torch, err = torchPrepass(sp, dir, meta, cfg); err != nil {
			return nil, err
		}
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
		err = writeDB(res.DumpPath, filepath.Join(dir, DumpDir), int64(meta.Pid), writeEvents)
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
	res.Events = dec.records
	res.Lost = dec.lost
	if end != nil && end.Lost > res.Lost {
		res.Lost = end.Lost
	}
	res.Exec = dec.exec
	res.Forks = dec.forks
	for _, c := range dec.forks {
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
	cpath := filepath.Join(dir, ConfigFile)
	if _, err := os.Stat(cpath); err == nil {
		cpath = uniquePath(filepath.Join(dir, "config_"+stamp), ".json")
	}
	if err := writeJSON(cpath, cj); err != nil {
		return nil, err
	}

	if cfg.HasAnalysis("inefficient") {
		// Results go into the dump's MALLOC rows (SPEC §5.3).
		r, err := analyzer.CheckInefficient(res.DumpPath, analyzer.IneffOptions{IdleThreshold: spec.DefaultIdleThreshold}, nil)
		if err != nil {
			return nil, err
		}
		if opt.Console != nil {
			fmt.Fprintf(opt.Console, "msmemscope: process %d (%s): %s", meta.Pid, progName(meta), r.Summary(5))
		}
	}
	if err := writeTorchReports(res, dir, stamp, cfg, dec.torch, decomp, opt.Console); err != nil {
		return nil, err
	}
	if cfg.HasAnalysis("leaks") {
		res.Leaks = leaks.Finish()
		if err := safefs.EnsureDir(filepath.Join(dir, AnalysisDir)); err != nil {
			return nil, err
		}
		res.LeaksPath = uniquePath(filepath.Join(dir, AnalysisDir, "leaks_"+stamp), ".csv")
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
func decodeBatches(dec *decoder) <-chan batch {
	out := make(chan batch, 8)
	go func() {
		defer close(out)
		const size = 4096
		for {
			b := batch{events: make([]*trace.Event, 0, size)}
			for len(b.events) < size {
				e, err := dec.next()
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

func progName(m *ProcessMeta) string {
	if len(m.Cmdline) > 0 {
		return filepath.Base(m.Cmdline[0])
	}
	return filepath.Base(m.Exe)
}

// uniquePath returns base+ext, or base_N+ext when that exists already.
func uniquePath(base, ext string) string {
	p := base + ext
	for i := 1; ; i++ {
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			return p
		}
		p = fmt.Sprintf("%s_%d%s", base, i, ext)
	}
}

// block is a live allocation while decoding.
type block struct {
	id      uint64
	size    uint64
	hidden  bool // allocated while collection was off: no MALLOC row yet
	tid     int32
	cstack  string
	pystack string
}

// decoder turns spool records into dump events: it numbers rows, pairs FREEs
// with their MALLOCs (allocation ids, sizes), writes shadow MALLOCs for blocks
// allocated while collection was off, names mstx ranges and numbers steps.
type decoder struct {
	r        *trace.SpoolReader
	siteMemo map[uint32]string
	mapsText string // the mappings to symbolize with, when given as text
	meta     *ProcessMeta
	cfg      config.Config
	pid      int64
	live     map[trace.BlockKey]*block
	ranges   map[uint64]string
	steps    trace.StepTracker
	nextID   uint64
	nextAID  uint64
	records  uint64
	lost     uint64
	exec     string
	forks    []int
	pending  []*trace.Event // a shadow MALLOC waits here before its FREE
	lastFree map[int32]trace.BlockKey
	lastSize map[int32]uint64

	sym       *symbolize.Symbolizer
	symDir    string
	stackMemo map[string]string

	sp       *trace.Spool
	mapsFile string
	pyMemo   map[string]string
	pyLines  map[trace.PyFrame]int
	scopes   map[int32][]string // describe scopes open per thread (owner tags)
	torch    *torchDec          // PyTorch records (torch.go)
	fast     bool               // a first pass: no stacks or sites
}

func newDecoder(sp *trace.Spool, dir string, meta *ProcessMeta, cfg config.Config) *decoder {
	d := &decoder{
		r: sp.Reader(), meta: meta, cfg: cfg, pid: int64(meta.Pid),
		live: map[trace.BlockKey]*block{}, ranges: map[uint64]string{},
		lastFree: map[int32]trace.BlockKey{}, lastSize: map[int32]uint64{},
		symDir: dir, stackMemo: map[string]string{},
		sp: sp, pyMemo: map[string]string{}, pyLines: map[trace.PyFrame]int{}, scopes: map[int32][]string{},
	}
	d.steps.UseStepCalls = sp.HasStep
	return d
}

// site symbolizes a MALLOC's allocation site (recorded even without stacks).
func (d *decoder) site(id uint32) string {
	if id == 0 {
		return ""
	}
	if s, ok := d.siteMemo[id]; ok {
		return s
	}
	addr, ok := d.sp.Sites[id]
	if !ok {
		return ""
	}
	if d.siteMemo == nil {
		d.siteMemo = map[uint32]string{}
	}
	s := d.symbolizer().Frame(addr)
	d.siteMemo[id] = s
	return s
}

func (d *decoder) symbolizer() *symbolize.Symbolizer {
	if d.sym == nil && d.mapsText != "" {
		d.sym = symbolize.New(d.mapsText)
	}
	if d.sym == nil {
		maps, err := os.ReadFile(d.mapsFile)
		if d.mapsFile == "" || err != nil {
			maps, err = os.ReadFile(filepath.Join(d.symDir, SpoolDir, MapsEnd))
		}
		if err != nil {
			maps, _ = os.ReadFile(filepath.Join(d.symDir, SpoolDir, MapsStart))
		}
		d.sym = symbolize.New(string(maps))
	}
	return d.sym
}

func (d *decoder) cstack(r *trace.Rec) string {
	if r.Flags&trace.FCStack == 0 {
		return ""
	}
	key := string(r.Payload)
	if s, ok := d.stackMemo[key]; ok {
		return s
	}
	cframes, _ := r.Stacks()
	frames := d.symbolizer().Frames(cframes)
	for i := range frames {
		frames[i] = strings.ReplaceAll(frames[i], ";", ",")
	}
	s := strings.Join(frames, ";")
	d.stackMemo[key] = s
	return s
}

// pystack names the Python frames of a MALLOC record (SPEC §2.1).
func (d *decoder) pystack(r *trace.Rec) string {
	if r.Flags&trace.FPyStack == 0 {
		return ""
	}
	key := string(r.Payload)
	if s, ok := d.pyMemo[key]; ok {
		return s
	}
	_, frames := r.Stacks()
	s := d.sp.Py.FormatPyStack(frames, d.pyLines)
	d.pyMemo[key] = s
	return s
}

func (d *decoder) emit(e *trace.Event) *trace.Event {
	d.nextID++
	e.ID = d.nextID
	e.Pid = d.pid
	if d.torch != nil {
		d.torchEmitted(e)
	}
	d.steps.Observe(e)
	return e
}

func (d *decoder) next() (*trace.Event, error) {
	if len(d.pending) > 0 {
		e := d.pending[0]
		d.pending = d.pending[1:]
		return d.emit(e), nil
	}
	for {
		r, ns, err := d.r.Next()
		if err != nil || r == nil {
			return nil, err
		}
		d.records++
		e := &trace.Event{Timestamp: ns, Tid: int64(r.Tid)}
		switch r.Kind {
		case trace.RMalloc:
			if ev := d.malloc(r, e); ev != nil {
				return d.emit(ev), nil
			}
		case trace.RFree:
			if ev := d.free(r, e); ev != nil {
				return d.emit(ev), nil
			}
		case trace.RStart, trace.RStop, trace.RStep, trace.RExit:
			e.Kind = trace.KindSystem
			e.Type = map[uint16]string{trace.RStart: trace.TypeStart, trace.RStop: trace.TypeStop,
				trace.RStep: trace.TypeStep, trace.RExit: trace.TypeProcessExit}[r.Kind]
			return d.emit(e), nil
		case trace.RMark, trace.RRangeStart, trace.RRangeEnd:
			e.Kind = trace.KindMstx
			e.MstxID = r.A
			switch r.Kind {
			case trace.RMark:
				e.Type, e.Name = trace.TypeMark, r.Text()
			case trace.RRangeStart:
				e.Type, e.Name = trace.TypeRangeStart, r.Text()
				d.ranges[r.A] = e.Name
			default:
				e.Type, e.Name = trace.TypeRangeEnd, d.ranges[r.A]
				delete(d.ranges, r.A)
			}
			return d.emit(e), nil
		case trace.RExec:
			d.exec = r.Text()
		case trace.RFork:
			d.forks = append(d.forks, int(r.A))
		case trace.RLost:
			d.lost += r.A
		case trace.ROwnerPush:
			d.scopes[r.Tid] = append(d.scopes[r.Tid], trace.CleanAttrValue(strings.ReplaceAll(r.Text(), "@", "_")))
		case trace.ROwnerPop:
			if s := d.scopes[r.Tid]; len(s) > 0 {
				d.scopes[r.Tid] = s[:len(s)-1]
			}
		default:
			if ev := d.torchRecord(r, e); ev != nil {
				return d.emit(ev), nil
			}
		}
	}
}

func subType(flags uint16) string {
	if flags&trace.FSubMask == trace.FMmap {
		return trace.TypeMmap
	}
	return trace.TypeHost
}

func owner(typ string) string {
	if typ == trace.TypeMmap {
		return "HOST@mmap"
	}
	return "HOST"
}

func (d *decoder) malloc(r *trace.Rec, e *trace.Event) *trace.Event {
	key := trace.BlockKey{Sub: r.Flags & trace.FSubMask, Ptr: r.A}
	size := r.B
	if r.Flags&trace.FUndo != 0 {
		// A failed realloc: the block freed just before lives on.
		if d.lastFree[r.Tid] != key {
			return nil
		}
		size = d.lastSize[r.Tid]
	}
	inherited := r.Flags&FInherit != 0
	if _, ok := d.live[key]; ok && inherited {
		return nil // a later rotated log repeats a block already live
	}
	if old, ok := d.live[key]; ok && old.tid != r.Tid && !r.Forced && !inherited {
		// Another thread has not freed this address yet in merged order:
		// its FREE is just ahead (sampled times). Hold this thread back.
		d.r.Park(key)
		d.records--
		return nil
	}
	d.nextAID++
	b := &block{id: d.nextAID, size: size, hidden: r.Flags&trace.FOff != 0, tid: r.Tid}
	d.live[key] = b // replaces a block whose FREE was never seen
	if b.hidden {
		if !d.fast {
			b.cstack = d.cstack(r)
			b.pystack = d.pystack(r)
		}
		return nil
	}
	e.Kind = trace.KindMalloc
	e.Type = subType(r.Flags)
	e.Device = trace.DeviceHost
	e.Ptr, e.HasPtr = r.A, true
	e.AllocID, e.Size = b.id, size
	e.Owner = owner(e.Type)
	if s := d.scopes[r.Tid]; len(s) > 0 {
		e.Owner += "@" + s[len(s)-1] // inside `with msmemscope.describe(owner=...)`
	}
	if !d.fast {
		e.CStack = d.cstack(r)
		e.Site = d.site(r.Site)
		e.PyStack = d.pystack(r)
	}
	// Allocated before the oldest rotated log still kept: like a block
	// allocated while collection was off, it gets a shadow MALLOC.
	e.Shadow = inherited
	return e
}

func (d *decoder) free(r *trace.Rec, e *trace.Event) *trace.Event {
	key := trace.BlockKey{Sub: r.Flags & trace.FSubMask, Ptr: r.A}
	b, ok := d.live[key]
	if !ok {
		return nil // freed memory we never saw allocated (or a file mapping)
	}
	delete(d.live, key)
	d.r.Wake(key, e.Timestamp)
	d.lastFree[r.Tid], d.lastSize[r.Tid] = key, b.size
	if r.Flags&trace.FOff != 0 {
		return nil
	}
	e.Kind = trace.KindFree
	e.Type = subType(r.Flags)
	e.Device = trace.DeviceHost
	e.Ptr, e.HasPtr = r.A, true
	e.AllocID, e.Size = b.id, b.size
	if b.hidden {
		// Allocated while collection was off, freed while on: a synthetic
		// MALLOC just before the FREE (SPEC §3).
		m := &trace.Event{Kind: trace.KindMalloc, Type: e.Type, Timestamp: e.Timestamp, Tid: e.Tid,
			Device: e.Device, Ptr: e.Ptr, HasPtr: true, AllocID: b.id, Size: b.size,
			Owner: owner(e.Type), Shadow: true, CStack: b.cstack, PyStack: b.pystack}
		d.pending = append(d.pending, e)
		return m
	}
	return e
}
