package spool

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"

	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/internal/u64map"
	"msmemscope/symbolize"
	"msmemscope/trace"
)

// block is a live allocation while decoding.
type block struct {
	id     uint64
	size   uint64
	hidden bool  // allocated while collection was off: no MALLOC row yet (its stacks: Decoder.hidden)
	own    bool  // msmemscope's own (format.FOwn): no row, nor for its FREE
	async  bool  // CUDA memory of an async allocation (cuMemAllocAsync: cudaMallocAsync's blocks)
	kind   uint8 // CUDA memory: its format.Dev* kind (R_DEVATTR); 0 for the host's
	dev    int16 // CUDA memory: its device ordinal, -1 none (pinned host memory)
	tid    int32
}

// Decoder turns spool records into dump events: it numbers rows, pairs FREEs
// with their MALLOCs (allocation ids, sizes), writes shadow MALLOCs for blocks
// allocated while collection was off, names mstx ranges and numbers steps.
type Decoder struct {
	r        *Reader
	siteMemo map[uint32]string
	mapsText string // the mappings to symbolize with, when given as text
	meta     *ProcessMeta
	cfg      config.Config
	follow   bool // FollowConfig
	pid      int64
	live     u64map.Map[block]    // by BlockKey
	hidden   map[uint64][2]string // the C and Python stacks of hidden blocks, by allocation id
	ranges   map[uint64]string
	steps    trace.StepTracker
	nextID   uint64
	nextAID  uint64
	records  uint64
	lost     uint64
	exec     string
	forks    []int
	pending  []*trace.Event   // a shadow MALLOC waits here before its FREE
	arena    []trace.Event    // where the next events are made (slot)
	dst      *trace.Event     // the caller's event to fill (NextInto)
	lastFree map[int32]*freed // each thread's last FREE (a failed realloc's block lives on)
	freedTid int32            // the thread of freedAt, the last one looked up
	freedAt  *freed

	sym       *symbolize.Symbolizer
	symDir    string
	stackMemo map[string]string

	sp       *Spool
	mapsFile string
	pyMemo   map[string]string
	pyLines  map[PyFrame]int
	scopes   map[int32][]string // describe scopes open per thread (owner tags)
	kinds    map[uint64]uint8   // allocation id -> leak kind, from the scan at exit (R_KINDS)
	torch    *torchDec          // PyTorch records (torch.go)
	streams  map[int32]uint64   // each thread's R_DEVATTR stream, for its next device MALLOC (cuda.go)
	fast     bool               // a pass that only judges rows: no stacks, sites or attrs
	noSites  bool               // NoSites

	events  uint64            // events recorded (rows they make, or one each that makes none)
	unrowed map[string]uint64 // events that made no row, by reason (Unwritten)
	reason  string            // why the record at hand makes no row

	hist       []histEntry     // PyTorch's CUDA tensor blocks, merged by time (cudahist.go)
	asyncTorch bool            // every async driver block is a tensor block (cudaMallocAsync)
	hi         int             // the next of hist
	histFloor  uint64          // no hist entry's row is earlier: records went first while one waited (histFirst)
	histTaken  map[uint64]bool // HAL blocks (allocation ids) an earlier segment_alloc took (segBlock)
	held       *Rec            // a record held back while hist entries before it were merged
	heldNs     uint64
	readerDone bool
}

// Reasons an event makes no row (config.json's events_not_written).
const (
	NotWrittenOff       = "recorded_while_collection_off" // allocated while collection was off, and freed then too (a block allocated then and freed while on gets a shadow MALLOC row; one allocated while on gets its FREE row whenever it is freed)
	NotWrittenUntracked = "free_of_untracked_block"       // a FREE of memory allocated before recording began (or a file mapping)
	NotWrittenUndo      = "failed_realloc"                // the MALLOC saying a failed realloc's block lives on
	NotWrittenRepeat    = "repeated_by_later_log"         // a block a later rotated log repeats as live
	NotWrittenEarlier   = "paired_in_earlier_log"         // in a rotated log read first: it pairs with a record of an earlier log, not read
	NotWrittenOption    = "not_selected"                  // a PyTorch record whose rows the options leave out
	NotWrittenOwn       = "msmemscope_own"                // allocated or freed by msmemscope's own work (its operator hooks)
	NotWrittenSteps     = "outside_steps"                 // written by the conversion: rows --steps leaves out
	NotWrittenInLogs    = "in_rotating_logs"              // written by the conversion at a rotated run's exit: rows the logs hold, no dump written (--input= writes it)
)

// isEvent reports whether a record of kind k is an event (can make rows),
// not the recorder's bookkeeping (clock, sites, stacks, code objects...).
func isEvent(k uint16) bool {
	switch k {
	case format.RMalloc, format.RFree, format.RStart, format.RStop, format.RStep, format.RExit,
		format.RMark, format.RRangeStart, format.RRangeEnd, format.ROpStart, format.ROpEnd, format.RSnapshot,
		format.RKernelLaunch, format.ROOM, format.RVmmMap, format.RVmmUnmap:
		return true
	}
	return false
}

// Events is the number of events decoded so far: every row stands for one,
// and Unwritten counts the others.
func (d *Decoder) Events() uint64 { return d.events + d.r.Earlier }

// Unwritten counts the events that made no row, by reason.
func (d *Decoder) Unwritten() map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range d.unrowed {
		if v > 0 {
			out[k] = v
		}
	}
	if d.r.Earlier > 0 {
		out[NotWrittenEarlier] = d.r.Earlier
	}
	return out
}

// Order is what the merge repaired and could not settle (OrderStats).
func (d *Decoder) Order() OrderStats { return d.r.Stats }

// NewDecoder decodes the spool sp of the capture folder dir (whose maps
// files symbolize C stacks). PyTorch records are skipped unless DecodeTorch
// is called before the first Next.
func NewDecoder(sp *Spool, dir string, meta *ProcessMeta, cfg config.Config) *Decoder {
	d := &Decoder{
		r: sp.Reader(), meta: meta, cfg: cfg, pid: int64(meta.Pid),
		live:   u64map.Map[block]{Runs: true, Grain: 4}, // blocks allocated together are near
		hidden: map[uint64][2]string{}, ranges: map[uint64]string{}, unrowed: map[string]uint64{},
		lastFree: map[int32]*freed{},
		symDir:   dir, stackMemo: map[string]string{},
		sp: sp, pyMemo: map[string]string{}, pyLines: map[PyFrame]int{}, scopes: map[int32][]string{},
	}
	d.steps.UseStepCalls = sp.HasStep
	h := sp.history(dir, cfg.LogMode == "rotate")
	d.hist, d.asyncTorch = h.entries, h.asyncTorch
	d.histTaken = map[uint64]bool{}
	d.r.SetLive(func(k BlockKey) bool { return d.live.Has(uint64(k)) })
	return d
}

// SymbolizeWith names the mappings that symbolize C stacks: a maps file
// (a capture converted while still running), or the maps text itself
// (/proc/self/maps now). Default: spool/maps.end.txt, else maps.start.txt.
func (d *Decoder) SymbolizeWith(mapsFile, mapsText string) {
	d.mapsFile, d.mapsText = mapsFile, mapsText
}

// DecodeTorch makes PyTorch records rows too (OP_LAUNCH, ACCESS, SNAPSHOT,
// PTA blocks with owners): when the spool holds them, it first decodes the
// spool once to learn which blocks are tensors (LearnTorch).
func (d *Decoder) DecodeTorch() error {
	ti, err := LearnTorch(d.sp, d.symDir, d.meta, d.cfg)
	if err != nil {
		return err
	}
	d.UseTorch(ti)
	return nil
}

// TorchInfo is what a first pass over a spool with PyTorch records learnt:
// which blocks are tensor storages, and their owners. Several decoders of
// one spool may share it.
type TorchInfo struct{ t *torchDec }

// LearnTorch runs that first pass; nil when the spool has no PyTorch records.
func LearnTorch(sp *Spool, dir string, meta *ProcessMeta, cfg config.Config) (*TorchInfo, error) {
	if h := sp.history(dir, cfg.LogMode == "rotate"); !sp.HasTorch && len(h.entries) == 0 && !h.asyncTorch {
		return nil, nil
	}
	t, err := torchPrepass(sp, dir, meta, cfg)
	if err != nil {
		return nil, err
	}
	return &TorchInfo{t}, nil
}

// FollowConfig makes the PyTorch rows follow the configuration as the
// capture changed it (msmemscope.config() between or within ranges: an
// RConfig record each): each range's launch and access rows as it asked,
// from the capture's own when it began (meta). Without it the decoder's
// configuration holds throughout. Called before UseTorch or DecodeTorch.
func (d *Decoder) FollowConfig() { d.follow = true }

// UseTorch makes PyTorch records rows, with what ti learnt (nil: none).
func (d *Decoder) UseTorch(ti *TorchInfo) {
	d.torch = newTorchDec(d.cfg, false)
	if d.follow {
		d.torch.launch, d.torch.access = d.meta.Config.Events.Launch, d.meta.Config.Events.Access
	}
	if ti != nil {
		d.torch.pta, d.torch.cat, d.torch.tag, d.torch.seg = ti.t.pta, ti.t.cat, ti.t.tag, ti.t.seg
	}
}

// NoSites leaves Event.Site empty: a reader with no use for allocation
// sites (they are not a column) reads no debug information for them.
func (d *Decoder) NoSites() { d.noSites = true }

// JudgeOnly makes this decoder a pass that only judges rows (the first
// pass of an analysis that annotates rows): no stacks, sites or attrs.
func (d *Decoder) JudgeOnly() { d.fast = true }

// Holds reports whether the spool, decoded, can hold rows of kind k:
// operator launches and ACCESS rows come only from PyTorch records.
func (s *Spool) Holds(k trace.Kind) bool {
	switch k {
	case trace.KindOpLaunch, trace.KindAccess:
		return s.HasTorch
	}
	return true
}

// Records is the number of spool records decoded so far.
func (d *Decoder) Records() uint64 { return d.records }

// Lost is the number of events the rings lost, as the spool recorded it.
func (d *Decoder) Lost() uint64 { return d.lost }

// Exec is the program this image exec'd into, if it did.
func (d *Decoder) Exec() string { return d.exec }

// Forks lists the children this image forked.
func (d *Decoder) Forks() []int { return d.forks }

// Watch is what the watch records found (after decoding with DecodeTorch).
func (d *Decoder) Watch() []WatchFinding {
	if d.torch == nil {
		return nil
	}
	return d.torch.watch
}

// site symbolizes a MALLOC's allocation site (recorded even without stacks).
func (d *Decoder) site(id uint32) string {
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

func (d *Decoder) symbolizer() *symbolize.Symbolizer {
	if d.sym == nil && d.mapsText != "" {
		d.sym = symbolize.New(d.mapsText)
	}
	if d.sym == nil {
		maps, err := os.ReadFile(d.mapsFile)
		if d.symDir != "" { // a spool read outside its capture folder has no maps
			if d.mapsFile == "" || err != nil {
				maps, err = os.ReadFile(filepath.Join(d.symDir, SpoolDir, MapsEnd))
			}
			if err != nil {
				maps, _ = os.ReadFile(filepath.Join(d.symDir, SpoolDir, MapsStart))
			}
		}
		d.sym = symbolize.New(string(maps))
	}
	return d.sym
}

func (d *Decoder) cstack(r *Rec) string {
	if r.Flags&format.FCStack == 0 {
		return ""
	}
	return memo(d.stackMemo, r.Payload, func() string {
		cframes, _ := r.Stacks()
		frames := d.symbolizer().Frames(cframes)
		for i := range frames {
			frames[i] = strings.ReplaceAll(frames[i], ";", ",")
		}
		return strings.Join(frames, ";")
	})
}

// memo names a stack payload once: a loop's blocks share their stacks.
func memo(m map[string]string, payload []byte, name func() string) string {
	if s, ok := m[string(payload)]; ok {
		return s
	}
	s := name()
	m[string(payload)] = s
	return s
}

// pystack names the Python frames of a MALLOC record (SPEC §2.1).
func (d *Decoder) pystack(r *Rec) string {
	if r.Flags&format.FPyStack == 0 {
		return ""
	}
	return memo(d.pyMemo, r.Payload, func() string {
		_, frames := r.Stacks()
		return d.sp.Py.FormatPyStack(frames, d.pyLines)
	})
}

func (d *Decoder) emit(e *trace.Event) *trace.Event {
	d.nextID++
	e.ID = d.nextID
	e.Pid = d.pid
	if d.torch != nil {
		d.torchEmitted(e)
	}
	d.steps.Observe(e)
	return e
}

// NextInto is Next filling dst: it returns dst, or another event (a row
// that was waiting) that the caller copies. dst is never kept.
func (d *Decoder) NextInto(dst *trace.Event) (*trace.Event, error) {
	d.dst = dst
	e, err := d.Next()
	d.dst = nil
	return e, err
}

// Next returns the next row's event, or nil at the end.
func (d *Decoder) Next() (*trace.Event, error) {
	if len(d.pending) > 0 {
		e := d.pending[0]
		d.pending = d.pending[1:]
		return d.emit(e), nil
	}
	for {
		var r *Rec
		var ns uint64
		var err error
		if d.held == nil && !d.readerDone { // (the reader's next, without a call more per row)
			if r, ns, err = d.r.Next(); r == nil && err == nil {
				d.readerDone = true
			}
		} else {
			r, ns = d.heldRec()
		}
		if err != nil {
			return nil, err
		}
		if d.hi < len(d.hist) && (r == nil || d.histFirst(r, ns)) {
			if r != nil {
				d.held, d.heldNs = r, ns
			}
			d.hi++
			if ev := d.tensorEntry(&d.hist[d.hi-1]); ev != nil {
				return d.emit(ev), nil
			}
			continue
		}
		if r == nil {
			return nil, nil
		}
		d.records++
		pend := len(d.pending)
		d.reason = NotWrittenOption
		e := d.slot(ns, r.Tid)
		ev := d.record(r, e)
		if d.dst == nil && (ev != nil || len(d.pending) != pend) {
			d.arena = d.arena[1:] // e may be in use: the next record gets a fresh one
		}
		if !isEvent(r.Kind) {
			if ev != nil {
				return d.emit(ev), nil
			}
			continue
		}
		switch rows := uint64(len(d.pending) - pend); {
		case ev == nil:
			d.events++
			d.unrowed[d.reason]++
			continue
		case r.Kind == format.RFree && ev.Kind == trace.KindMalloc:
			// A shadow MALLOC: the block's MALLOC, recorded while
			// collection was off, gets its row now.
			d.unrowed[NotWrittenOff]--
			d.events++
		default:
			d.events += 1 + rows
		}
		return d.emit(ev), nil
	}
}

// slot is the event the next record fills: the first of d.arena, which Next
// moves past once the record made a row. Events come from arenas of
// eventArena, allocated whole: one allocation per row was a fifth of the
// conversion's time.
func (d *Decoder) slot(ns uint64, tid int32) *trace.Event {
	if d.dst != nil {
		*d.dst = trace.Event{Timestamp: ns, Tid: int64(tid)}
		return d.dst
	}
	if len(d.arena) == 0 {
		d.arena = make([]trace.Event, eventArena)
	}
	e := &d.arena[0]
	*e = trace.Event{Timestamp: ns, Tid: int64(tid)}
	return e
}

const eventArena = 256

// record turns one record into its first row, filling e (nil: none; others
// wait in d.pending), setting d.reason when it makes none.
func (d *Decoder) record(r *Rec, e *trace.Event) *trace.Event {
	switch r.Kind {
	case format.RMalloc:
		return d.malloc(r, e)
	case format.RFree:
		return d.free(r, e)
	case format.RStart, format.RStop, format.RStep, format.RExit:
		e.Kind = trace.KindSystem
		e.Type = map[uint16]string{format.RStart: trace.TypeStart, format.RStop: trace.TypeStop,
			format.RStep: trace.TypeStep, format.RExit: trace.TypeProcessExit}[r.Kind]
		return e
	case format.RMark, format.RRangeStart, format.RRangeEnd:
		e.Kind = trace.KindMstx
		e.MstxID = r.A
		switch r.Kind {
		case format.RMark:
			e.Type, e.Name = trace.TypeMark, r.Text()
		case format.RRangeStart:
			e.Type, e.Name = trace.TypeRangeStart, r.Text()
			d.ranges[r.A] = e.Name
		default:
			e.Type, e.Name = trace.TypeRangeEnd, d.ranges[r.A]
			delete(d.ranges, r.A)
		}
		return e
	case format.RExec:
		d.exec = r.Text()
	case format.RFork:
		d.forks = append(d.forks, int(r.A))
	case format.RLost:
		d.lost += r.A
	case format.RKinds:
		d.leakKinds(r)
	case format.RDevAttr:
		d.noteDevAttr(r)
	case format.RKernelLaunch:
		return d.kernelLaunch(r, e)
	case format.ROOM:
		return d.oom(r, e)
	case format.RVmmMap, format.RVmmUnmap:
		return d.vmmMapping(r, e)
	case format.RSnapshot:
		return d.snapshot(r, e)
	case format.ROwnerPush:
		d.scopes[r.Tid] = append(d.scopes[r.Tid], trace.CleanAttrValue(strings.ReplaceAll(r.Text(), "@", "_")))
	case format.ROwnerPop:
		if s := d.scopes[r.Tid]; len(s) > 0 {
			d.scopes[r.Tid] = s[:len(s)-1]
		}
	default:
		return d.torchRecord(r, e)
	}
	return nil
}

func subType(flags uint16) string {
	switch flags & format.FSubMask {
	case format.FMmap:
		return trace.TypeMmap
	case format.FHal, format.FVmm:
		return trace.TypeHAL
	case format.FPinned:
		return trace.TypeHostPinned
	}
	return trace.TypeHost
}

func owner(typ string) string {
	switch typ {
	case trace.TypeMmap:
		return "HOST@mmap"
	case trace.TypeHAL, trace.TypeHostPinned:
		return "HAL"
	}
	return "HOST"
}

func (d *Decoder) malloc(r *Rec, e *trace.Event) *trace.Event {
	key := KeyOf(r)
	size := BlockSize(r)
	b := block{hidden: r.Flags&format.FOff != 0, tid: r.Tid, dev: -1}
	var stream uint64
	if isDevice(r.Flags) { // (first: its R_DEVATTR is this MALLOC's, whatever becomes of it)
		b.kind, b.dev, stream, b.async = d.devOf(r)
	}
	if r.Flags&format.FUndo != 0 {
		// A failed realloc: the block freed just before lives on.
		d.reason = NotWrittenUndo
		f := d.freedBy(r.Tid)
		if f.key != key {
			return nil
		}
		size = f.size
	}
	inherited := r.Flags&format.FInherit != 0
	if inherited && d.live.Has(uint64(key)) {
		d.reason = NotWrittenRepeat
		return nil // a later rotated log repeats a block already live
	}
	if r.Flags&format.FOwn != 0 {
		// msmemscope's own work (its operator hooks): tracked so that
		// its FREE pairs, never a row.
		d.live.Put(uint64(key), block{size: size, own: true, tid: r.Tid})
		d.reason = NotWrittenOwn
		return nil
	}
	d.nextAID++
	b.id, b.size = d.nextAID, size
	if b.async && d.asyncTorch && d.torch != nil && d.torch.pre {
		d.torch.pta[b.id] = true // cudaMallocAsync's blocks are the tensors'
	}
	if len(d.hidden) > 0 {
		if old, ok := d.live.Get(uint64(key)); ok && old.hidden {
			delete(d.hidden, old.id) // replaced: its FREE was never seen
		}
	}
	d.live.Put(uint64(key), b) // replaces a block whose FREE was never seen
	if b.hidden {
		if !d.fast {
			d.hidden[b.id] = [2]string{d.cstack(r), d.pystack(r)}
		}
		d.reason = NotWrittenOff
		return nil
	}
	e.Kind = trace.KindMalloc
	e.Type = subType(r.Flags)
	e.Device = deviceOf(b)
	e.Ptr, e.HasPtr = r.A, true
	e.AllocID, e.Size = b.id, size
	e.Owner = owner(e.Type)
	if b.kind != 0 && !d.fast {
		setDevAttrs(e, b, stream)
	}
	if s := d.scopes[r.Tid]; len(s) > 0 {
		e.Owner += "@" + s[len(s)-1] // inside `with msmemscope.describe(owner=...)`
	}
	if !d.fast {
		e.CStack = d.cstack(r)
		if !d.noSites {
			e.Site = d.site(r.Site)
		}
		e.PyStack = d.pystack(r)
	}
	// Allocated before the oldest rotated log still kept: like a block
	// allocated while collection was off, it gets a shadow MALLOC.
	e.Shadow = inherited
	return e
}

func (d *Decoder) free(r *Rec, e *trace.Event) *trace.Event {
	key := KeyOf(r)
	b, ok := d.live.Take(uint64(key))
	if !ok {
		d.reason = NotWrittenUntracked
		return nil // freed memory we never saw allocated (or a file mapping)
	}
	f := d.freedBy(r.Tid)
	f.key, f.size = key, b.size
	if b.own {
		d.reason = NotWrittenOwn
		return nil
	}
	if r.Flags&format.FOff != 0 && b.hidden {
		delete(d.hidden, b.id) // no shadow MALLOC will need its stacks
		d.reason = NotWrittenOff
		return nil
	}
	// (A block whose MALLOC row was written gets its FREE row even while
	// collection is off: else it would read as alive at exit, a leak
	// invented by stop() or a device option.)
	e.Kind = trace.KindFree
	e.Type = subType(r.Flags)
	e.Device = deviceOf(b)
	e.Ptr, e.HasPtr = r.A, true
	e.AllocID, e.Size = b.id, b.size
	if b.hidden {
		// Allocated while collection was off, freed while on: a synthetic
		// MALLOC just before the FREE (SPEC §3).
		st := d.hidden[b.id]
		delete(d.hidden, b.id)
		m := &trace.Event{Kind: trace.KindMalloc, Type: e.Type, Timestamp: e.Timestamp, Tid: e.Tid,
			Device: e.Device, Ptr: e.Ptr, HasPtr: true, AllocID: b.id, Size: b.size,
			Owner: owner(e.Type), Shadow: true, CStack: st[0], PyStack: st[1]}
		if b.kind != 0 {
			setDevAttrs(m, b, 0)
		}
		f := *e // e may be the caller's (NextInto), which m is copied into
		d.pending = append(d.pending, &f)
		return m
	}
	return e
}

// freed is a thread's last FREE: its block and size.
type freed struct {
	key  BlockKey
	size uint64
}

// freedBy is thread tid's last FREE, looked up once per run of its records.
func (d *Decoder) freedBy(tid int32) *freed {
	if d.freedAt == nil || d.freedTid != tid {
		f := d.lastFree[tid]
		if f == nil {
			f = &freed{}
			d.lastFree[tid] = f
		}
		d.freedTid, d.freedAt = tid, f
	}
	return d.freedAt
}

// leakKinds notes the leak kinds the scan at exit gave the blocks live then.
func (d *Decoder) leakKinds(r *Rec) {
	if d.kinds == nil {
		d.kinds = map[uint64]uint8{}
	}
	for i := 0; i+8 <= len(r.Payload) && uint64(i/8) < r.A; i += 8 {
		u := binary.LittleEndian.Uint64(r.Payload[i:])
		if b, ok := d.live.Get(uint64(MakeKey(format.FHost, u&(1<<56-1)))); ok && !b.own {
			d.kinds[b.id] = uint8(u >> 56)
		}
	}
}

// LeakKinds returns the leak kind (leakscan.Kind) of each block live at the
// end by allocation id, or nil when the capture holds no scan (a run killed,
// ended with _exit, or with rotating logs).
func (d *Decoder) LeakKinds() map[uint64]uint8 { return d.kinds }
