package analyzer

import (
	"cmp"
	"container/heap"
	"fmt"
	"slices"
	"strings"

	"msmemscope/trace"

	"msmemscope/internal/safefs"
)

// Inefficient memory (SPEC §5.3). The api id of a process counts its
// ATEN_START launches, plus the PTA and HAL memory events that happen
// outside any operator (each is an api of its own). Only PTA and HAL blocks
// of at least MemSize bytes are judged:
//
//   - early_allocation: a FREE happens in an api strictly between the
//     block's MALLOC api and its first ACCESS api (the memory could have
//     been allocated later, after that FREE);
//   - late_deallocation: a MALLOC happens in an api strictly between the
//     block's last ACCESS api and its FREE api (it could have been freed
//     before that MALLOC);
//   - temporary_idleness: two consecutive ACCESSes of the block whose api
//     ids differ by more than IdleThreshold.
//
// The FREEs and MALLOCs that count are the PTA and HAL ones of the same
// process. A type is reported at most once per block. An operator's end is
// its ATEN_END (operators may nest); ACCESS rows find their block by
// allocation_id.

// Inefficiency types.
const (
	EarlyAllocation   = "early_allocation"
	LateDeallocation  = "late_deallocation"
	TemporaryIdleness = "temporary_idleness"
)

// IneffTypes lists the types in their canonical order.
var IneffTypes = []string{EarlyAllocation, LateDeallocation, TemporaryIdleness}

const (
	flagEarly = 1 << iota
	flagLate
	flagIdle
)

// IneffOptions are check_inefficient's parameters.
type IneffOptions struct {
	MemSize       uint64   // blocks smaller than this are not judged
	Types         []string // the types to look for; empty: all
	IdleThreshold uint64   // temporary_idleness: more than this many apis between accesses (default: spec.DefaultIdleThreshold)
}

// IneffBlock is a block found inefficient.
type IneffBlock struct {
	ID             uint64   `json:"id"` // the MALLOC row's ID
	AllocID        uint64   `json:"allocation_id"`
	Pid            int64    `json:"pid"`
	Size           uint64   `json:"size"`
	EventType      string   `json:"event_type"`
	Device         string   `json:"device"`
	Types          []string `json:"inefficient"`
	MallocAPI      uint64   `json:"malloc_api"`
	FirstAccessAPI uint64   `json:"first_access_api"`
	LastAccessAPI  uint64   `json:"last_access_api"`
	FreeAPI        uint64   `json:"free_api"` // 0: never freed
	EarlySpan      uint64   `json:"early_api_span,omitempty"`
	LateSpan       uint64   `json:"late_api_span,omitempty"`
	IdleSpan       uint64   `json:"idle_api_span,omitempty"`
}

// IneffTotal sums one type's findings.
type IneffTotal struct {
	Blocks  int    `json:"blocks"`
	Bytes   uint64 `json:"bytes"`
	APISpan uint64 `json:"api_span"` // apis wasted, summed over the blocks
}

// IneffReport is check_inefficient's result.
type IneffReport struct {
	Input         string                `json:"input_path"`
	MemSize       uint64                `json:"mem_size"`
	Types         []string              `json:"inefficient_type"`
	IdleThreshold uint64                `json:"idle_threshold"`
	Rows          uint64                `json:"rows_analysed"`  // rows of the kinds the analysis reads
	APIs          uint64                `json:"apis"`           // the highest api id seen
	Judged        int                   `json:"blocks_judged"`  // PTA/HAL blocks of at least mem_size
	Blocks        []IneffBlock          `json:"blocks"`         // the largest MaxIneffBlocks, by MALLOC row ID
	BlocksTotal   int                   `json:"blocks_total"`   // blocks found inefficient
	Totals        map[string]IneffTotal `json:"summary"`        // by type
	Added         int                   `json:"results_added"`  // results written to the file (new ones only)
	Written       bool                  `json:"file_rewritten"` // whether the file was changed
	marks         []ineffFound
}

// MaxIneffBlocks bounds the blocks a report lists (the largest): the file
// gets every result, and memory stays small when most blocks are found.
const MaxIneffBlocks = 1000

// ineffFound is a block's results in 16 bytes: all a report keeps of every
// block found.
type ineffFound struct {
	id    uint64
	flags uint8
	isNew bool // adds a result the row does not hold yet
}

type ineffProc struct {
	api                    uint64
	depth                  int
	lastFree, prevFree     uint64                // the two latest distinct apis holding a FREE
	lastMalloc, prevMalloc uint64                // the same for MALLOC
	live                   map[uint64]*ineffLive // judged blocks alive, by allocation id
}

type ineffLive struct {
	b        IneffBlock
	off      int64 // where its MALLOC row starts in a CSV (with a writer)
	flags    uint8
	had      uint8 // the results its MALLOC row holds already
	accessed bool
	pinned   bool // the writer was told its row gets results
}

// InefficientAnalyzer judges blocks over a stream of events; memory grows
// with the live judged blocks, plus 16 bytes per block found inefficient.
type InefficientAnalyzer struct {
	opt    IneffOptions
	want   uint8
	procs  map[int64]*ineffProc
	found  []ineffFound
	top    ineffHeap // the largest blocks found, at most MaxIneffBlocks
	totals [3]IneffTotal
	rows   uint64
	apis   uint64
	judged int

	spare    []*ineffLive // retired blocks to reuse: one per MALLOC row adds up
	lastPid  int64        // rows of one process come in runs: its proc, cached
	lastProc *ineffProc

	// Writing the results into a CSV while reading it (see trace.IneffWriter).
	w    *trace.IneffWriter
	in   trace.Input // where the MALLOC rows are
	sure int64       // a MALLOC row's offset, to tell w as final once ineffLag is read past it
}

// ineffLag is how far past a MALLOC row the analysis reads before telling
// the writer that the row is final when its block is still alive. Blocks
// alive longer are guessed to get no results (a wrong guess costs copying
// again): most results are found within a few MiB of their row, and blocks
// that never get one (weights, leaks) must not hold the copy back. A
// variable for tests.
var ineffLag int64 = 32 << 20

// ineffHeap is a min-heap of blocks by size (then latest row first out).
type ineffHeap []IneffBlock

func (h ineffHeap) Len() int { return len(h) }
func (h ineffHeap) Less(i, j int) bool {
	if h[i].Size != h[j].Size {
		return h[i].Size < h[j].Size
	}
	return h[i].ID > h[j].ID
}
func (h ineffHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *ineffHeap) Push(x any)   { *h = append(*h, x.(IneffBlock)) }
func (h *ineffHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// NewInefficientAnalyzer returns an analyzer for opt (validated by the
// caller: see CheckIneffTypes).
func NewInefficientAnalyzer(opt IneffOptions) *InefficientAnalyzer {
	a := &InefficientAnalyzer{opt: opt, procs: map[int64]*ineffProc{}}
	if len(opt.Types) == 0 {
		a.want = flagEarly | flagLate | flagIdle
	}
	for _, t := range opt.Types {
		a.want |= typeFlag(t)
	}
	return a
}

func typeFlag(t string) uint8 {
	switch t {
	case EarlyAllocation:
		return flagEarly
	case LateDeallocation:
		return flagLate
	case TemporaryIdleness:
		return flagIdle
	}
	return 0
}

// CheckIneffTypes validates an inefficient_type list.
func CheckIneffTypes(types []string) error {
	for _, t := range types {
		if typeFlag(t) == 0 {
			return fmt.Errorf("unknown inefficient_type %q: valid types are %s", t, strings.Join(IneffTypes, ", "))
		}
	}
	return nil
}

// flagsOf parses a MALLOC's inefficient attr ("a|b").
func flagsOf(s string) uint8 {
	var f uint8
	for s != "" {
		t, rest, _ := strings.Cut(s, "|")
		f |= typeFlag(t)
		s = rest
	}
	return f
}

func judgedType(t string) bool { return t == trace.TypePTA || t == trace.TypeHAL }

func (a *InefficientAnalyzer) proc(pid int64) *ineffProc {
	if a.lastProc != nil && a.lastPid == pid {
		return a.lastProc
	}
	p := a.procs[pid]
	if p == nil {
		p = &ineffProc{live: map[uint64]*ineffLive{}}
		a.procs[pid] = p
	}
	a.lastPid, a.lastProc = pid, p
	return p
}

// Observe feeds the next event.
func (a *InefficientAnalyzer) Observe(e *trace.Event) {
	a.rows++
	switch e.Kind {
	case trace.KindOpLaunch:
		p := a.proc(e.Pid)
		switch e.Type {
		case "ATEN_START":
			p.api++
			p.depth++
			a.apis = max(a.apis, p.api)
		case "ATEN_END":
			if p.depth > 0 {
				p.depth--
			}
		}
	case trace.KindMalloc, trace.KindFree:
		if !judgedType(e.Type) {
			return
		}
		p := a.proc(e.Pid)
		if p.depth == 0 {
			p.api++
			a.apis = max(a.apis, p.api)
		}
		api := p.api
		if e.Kind == trace.KindMalloc {
			if old := p.live[e.AllocID]; old != nil { // a MALLOC of a live id: the old block is gone
				delete(p.live, e.AllocID)
				a.retire(old)
				a.spare = append(a.spare, old)
			}
			off := int64(-1)
			if a.w != nil {
				off = a.in.Offset()
				if off >= a.sure+ineffLag {
					a.w.Final(a.sure)
					a.sure = off
				}
			}
			if e.Size >= a.opt.MemSize {
				a.judged++
				l := a.newLive()
				*l = ineffLive{b: IneffBlock{ID: e.ID, AllocID: e.AllocID, Pid: e.Pid, Size: e.Size,
					EventType: e.Type, Device: e.Device, MallocAPI: api}, off: off, had: flagsOf(e.Inefficient)}
				p.live[e.AllocID] = l
			}
			if api != p.lastMalloc {
				p.prevMalloc, p.lastMalloc = p.lastMalloc, api
			}
			return
		}
		if l := p.live[e.AllocID]; l != nil {
			l.b.FreeAPI = api
			if l.accessed {
				// The latest api before this one holding a MALLOC.
				m := p.lastMalloc
				if m >= api {
					m = p.prevMalloc
				}
				if m > l.b.LastAccessAPI {
					l.flags |= flagLate
					l.b.LateSpan = api - l.b.LastAccessAPI
				}
			}
			delete(p.live, e.AllocID)
			a.retire(l)
			a.spare = append(a.spare, l)
		}
		if api != p.lastFree {
			p.prevFree, p.lastFree = p.lastFree, api
		}
	case trace.KindAccess:
		p := a.proc(e.Pid)
		l := p.live[e.AllocID]
		if l == nil {
			return
		}
		api := p.api
		if !l.accessed {
			l.accessed = true
			l.b.FirstAccessAPI = api
			// The latest api before this one holding a FREE.
			f := p.lastFree
			if f >= api {
				f = p.prevFree
			}
			if f > l.b.MallocAPI {
				l.flags |= flagEarly
				l.b.EarlySpan = api - l.b.MallocAPI
				a.pin(l)
			}
		} else if gap := api - l.b.LastAccessAPI; api > l.b.LastAccessAPI && gap > a.opt.IdleThreshold {
			l.flags |= flagIdle
			l.b.IdleSpan += gap
			a.pin(l)
		}
		l.b.LastAccessAPI = api
	}
}

func (a *InefficientAnalyzer) newLive() *ineffLive {
	if n := len(a.spare); n > 0 {
		l := a.spare[n-1]
		a.spare = a.spare[:n-1]
		return l
	}
	return new(ineffLive)
}

// pin tells the writer, once, that l's row will get results: its copy
// must wait for them.
func (a *InefficientAnalyzer) pin(l *ineffLive) {
	if a.w != nil && !l.pinned && l.flags&a.want&^l.had != 0 {
		l.pinned = true
		a.w.Pin(l.off)
	}
}

// retire records a block that leaves the live set, if it was found
// inefficient in a type asked for.
func (a *InefficientAnalyzer) retire(l *ineffLive) {
	f := l.flags & a.want
	if f == 0 {
		return
	}
	isNew := f&^l.had != 0
	a.found = append(a.found, ineffFound{l.b.ID, f, isNew})
	if a.w != nil && isNew {
		a.w.Add(l.off, trace.IneffMark{ID: l.b.ID, Types: ineffTypeLists[f]})
	}
	spans := [3]uint64{l.b.EarlySpan, l.b.LateSpan, l.b.IdleSpan}
	for i, t := range IneffTypes {
		if f&typeFlag(t) != 0 {
			a.totals[i].Blocks++
			a.totals[i].Bytes += l.b.Size
			a.totals[i].APISpan += spans[i]
		}
	}
	if len(a.top) < MaxIneffBlocks || a.top[0].Size < l.b.Size {
		b := l.b
		b.Types = ineffTypeLists[f]
		if f&flagEarly == 0 {
			b.EarlySpan = 0
		}
		if f&flagLate == 0 {
			b.LateSpan = 0
		}
		if f&flagIdle == 0 {
			b.IdleSpan = 0
		}
		heap.Push(&a.top, b)
		if len(a.top) > MaxIneffBlocks {
			heap.Pop(&a.top)
		}
	}
}

// ineffTypeLists are the type lists of each flag combination, shared.
var ineffTypeLists = func() (l [8][]string) {
	for f := range l {
		for _, t := range IneffTypes {
			if uint8(f)&typeFlag(t) != 0 {
				l[f] = append(l[f], t)
			}
		}
	}
	return l
}()

// Finish judges the blocks still alive and returns the report.
func (a *InefficientAnalyzer) Finish() *IneffReport {
	for _, p := range a.procs {
		for _, l := range p.live {
			a.retire(l)
		}
		p.live = nil
	}
	slices.SortFunc(a.found, func(x, y ineffFound) int { return cmp.Compare(x.id, y.id) })
	blocks := []IneffBlock(a.top)
	slices.SortFunc(blocks, func(x, y IneffBlock) int { return cmp.Compare(x.ID, y.ID) })
	r := &IneffReport{MemSize: a.opt.MemSize, Types: a.opt.Types, IdleThreshold: a.opt.IdleThreshold,
		Rows: a.rows, APIs: a.apis, Judged: a.judged, Blocks: blocks, BlocksTotal: len(a.found),
		Totals: map[string]IneffTotal{}, marks: a.found}
	if len(r.Types) == 0 {
		r.Types = IneffTypes
	}
	for i, t := range IneffTypes {
		if slices.Contains(r.Types, t) {
			r.Totals[t] = a.totals[i]
		}
	}
	return r
}

// Marks returns the results to write into the MALLOC rows, by row ID: those
// of the blocks whose rows miss some of them.
func (r *IneffReport) Marks() []trace.IneffMark {
	var m []trace.IneffMark
	for _, f := range r.marks {
		if f.isNew {
			m = append(m, trace.IneffMark{ID: f.id, Types: ineffTypeLists[f.flags]})
		}
	}
	return m
}

// CheckInefficient runs the analysis over a dump file (CSV or SQLite) and
// adds its results to the file's MALLOC rows, keeping earlier results and
// adding none twice. A CSV is rewritten while it is read (trace.IneffWriter).
func CheckInefficient(path string, opt IneffOptions, prog *Progress) (*IneffReport, error) {
	if err := CheckIneffTypes(opt.Types); err != nil {
		return nil, err
	}
	if opt.IdleThreshold == 0 {
		return nil, fmt.Errorf("idle_threshold must be a positive integer")
	}
	defer prog.Done()
	return runInefficient(path, opt, prog, true)
}

func analyzeInefficient(path string, opt IneffOptions, prog *Progress) (*IneffReport, error) {
	return runInefficient(path, opt, prog, false)
}

// runInefficient runs the analysis, and with write adds its results to the
// file.
func runInefficient(path string, opt IneffOptions, prog *Progress, write bool) (*IneffReport, error) {
	in, err := trace.Open(path, trace.OpenOptions{Lean: true, Reuse: true, IndexMallocs: write,
		Kinds: []trace.Kind{trace.KindOpLaunch, trace.KindMalloc, trace.KindFree, trace.KindAccess}})
	if err != nil {
		return nil, err
	}
	defer in.Close()
	prog.Track(in)
	a := NewInefficientAnalyzer(opt)
	if write && in.Format() == trace.FormatCSV {
		a.w, a.in = trace.NewIneffWriter(path), in
		defer a.w.Abort()
	}
	if err := trace.Each(in, func(e *trace.Event) error { a.Observe(e); return nil }); err != nil {
		return nil, err
	}
	r := a.Finish()
	r.Input = path
	in.Close() // its buffers are not needed for the rest
	if !write {
		return r, nil
	}
	prog.Phase("check_inefficient: writing results")
	if a.w != nil {
		prog.Func(a.w.Progress)
		r.Added, err = a.w.Commit()
	} else {
		r.Added, err = trace.AddInefficient(path, r.Marks(), func(done, total int64) {
			prog.Func(func() (int64, int64) { return done, total })
		})
	}
	if err != nil {
		return nil, err
	}
	r.Written = r.Added > 0
	return r, nil
}

// Summary is the console report of check_inefficient.
func (r *IneffReport) Summary(top int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "check_inefficient %s: %d rows analysed, %d apis, %d PTA/HAL blocks of at least %d bytes judged (idle_threshold %d)\n",
		r.Input, r.Rows, r.APIs, r.Judged, r.MemSize, r.IdleThreshold)
	for _, t := range r.Types {
		s := r.Totals[t]
		fmt.Fprintf(&b, "  %-19s %6d block%s %10s  %d api%s wasted\n", t, s.Blocks, leakPlural(s.Blocks), safefs.HumanBytes(s.Bytes), s.APISpan, leakPlural(int(s.APISpan)))
	}
	if len(r.Blocks) > 0 && top > 0 {
		bs := slices.Clone(r.Blocks)
		slices.SortStableFunc(bs, func(x, y IneffBlock) int { return cmp.Compare(y.Size, x.Size) })
		b.WriteString("  largest:\n")
		for _, x := range bs[:min(top, len(bs))] {
			fmt.Fprintf(&b, "    ID %d: %s %s (allocation_id %d): %s\n", x.ID, safefs.HumanBytes(x.Size), x.EventType, x.AllocID, strings.Join(x.Types, "|"))
		}
	}
	switch {
	case r.Added > 0:
		fmt.Fprintf(&b, "  %d result%s added to the MALLOC rows of %s\n", r.Added, leakPlural(r.Added), r.Input)
	case r.BlocksTotal > 0:
		fmt.Fprintf(&b, "  every result was already in %s: file unchanged\n", r.Input)
	default:
		b.WriteString("  no inefficient blocks: file unchanged\n")
	}
	return b.String()
}
