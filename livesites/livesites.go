// Package livesites keeps the live bytes per allocation site of a running
// capture as its spool grows (spool.Tail): each catch-up reads only what
// the drain wrote since the last one, never a replay. Two readers in
// libmemscope keep one: a measurement window (the blocks allocated between
// two calls, and their peak) and get_mem_report (every block of the
// capture).
package livesites

import (
	"math"
	"os"
	"sort"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/format"
	"msmemscope/internal/u64map"
	"msmemscope/spool"
	"msmemscope/symbolize"
	"msmemscope/trace"
)

// Set is the live blocks of a spool by allocation site.
//
// Threads' records come in the order the drain wrote them, so another
// thread's FREE of a block may come before its MALLOC (in the same drain
// pass, or the next when the MALLOC came after its thread's ring was
// drained, or later still when a pass ends before a busy ring is empty): a
// FREE of an unknown address is kept, and a later MALLOC of that address
// by another thread is taken as freed unless the stamps show it came after
// that FREE (then the FREE was an older block's) — never a leak invented.
type Set struct {
	tail      *spool.Tail
	subs      func(sub uint16) bool // the kinds of memory kept (format.FSubMask)
	peaks     bool                  // whether the sites at the peak are kept (a window's)
	blocks    u64map.Map[wBlock]    // by spool.BlockKey (Go's map spent most of a catch-up's time)
	sites     []wSite
	index     map[wSiteKey]int32
	live      uint64
	peak      uint64
	dirty     bool // the state now is the peak's, not yet copied to peakAt
	peakAt    []wSite
	allocated uint64
	nalloc    int
	orphans   map[spool.BlockKey][]orphanFree // FREEs of blocks not seen (yet), per address in spool order
	freed     map[int32]freedBlock            // by thread: the block its latest FREE ended (a failed realloc's)
	pass      int
	names     []analyzer.SiteSize // Report's names of the sites, by index ("": not named yet)
	recent    [16]int32           // recent sites, 1-based (0: none), by a hash of their key
	merge     merger              // the records read, merged in time order before they count (merge.go)
}

// maxStack is how many Python frames a site keeps for its report.
const maxStack = 8

type wSiteKey struct {
	code  uint32 // innermost Python frame's code id (0: no Python stack)
	lasti int32
	csite uint32 // the allocator's caller (its site id) when no Python frame
	cpc   uint64 // with C stacks: their innermost frame instead (as a dump's rows name it)
	cstk  uint32 // or the id of an interned C stack (F_STACKID), whose innermost frame names it
}

type wSite struct {
	key    wSiteKey
	frames []spool.PyFrame // a sample stack, innermost first
	live   uint64
	count  int
}

// wBlock is a live block: its size and site; site -1 is a block that
// counts nothing but is tracked so that its FREE pairs (msmemscope's own,
// or allocated while collection was off). stale counts the FREEs of the
// blocks it replaced at its address that are still to be read (another
// thread's).
type wBlock struct {
	size  uint64
	ts    uint64 // its MALLOC's stamp
	site  int32
	tid   int32 // the allocating thread
	stale int32
}

// freedBlock is the block a thread's latest FREE ended.
type freedBlock struct {
	key spool.BlockKey
	b   wBlock
}

// orphanFree is a FREE whose block has not been seen (yet).
type orphanFree struct {
	ts   uint64
	tid  int32
	pass int
}

// New follows the spool t reads; keep says which kinds of memory count
// (format.FSubMask), peaks whether the sites at the peak are kept.
func New(t *spool.Tail, keep func(sub uint16) bool, peaks bool) *Set {
	s := &Set{tail: t, subs: keep, peaks: peaks, index: map[wSiteKey]int32{},
		orphans: map[spool.BlockKey][]orphanFree{}, freed: map[int32]freedBlock{}}
	s.blocks.Runs, s.blocks.Grain = true, 4 // addresses, 16-byte aligned, in runs
	return s
}

// CatchUp reads what the spool holds beyond the last catch-up (call it
// after draining every ring: see dropOrphans).
func (s *Set) CatchUp() error {
	s.pass++
	err := s.tail.Read(s.collect)
	s.flush(0)
	s.dropOrphans()
	return err
}

// freedFirst reports whether a MALLOC stamped m came before the FREE o of
// its address (o then ended this block); where the stamps cannot tell, a
// FREE of the last two catch-ups is taken to be this block's.
func (s *Set) freedFirst(o orphanFree, m uint64) bool {
	switch s.order(m, o.ts) {
	case before:
		return true
	case after:
		return false
	}
	return o.pass >= s.pass-1
}

// An order of two stamps.
const (
	unknown = iota
	before
	after
)

// stampJitter is how far apart two precise stamps of different threads must
// be for their order to count: an unfenced TSC read's drift, with room (in
// ticks, or ns where the stamps are CLOCK_MONOTONIC).
const stampJitter = 2000

// order tells whether stamp a came before or after stamp b. Two drain epochs
// compare by number (equal: unknown); a precise stamp and an epoch compare
// with the epoch's span, from its start to when the drain moved the gate
// past it (where the spool recorded that).
func (s *Set) order(a, b uint64) int {
	if (a^b)&format.TSEpoch == 0 && a&format.TSEpoch != 0 {
		switch {
		case a < b:
			return before
		case a > b:
			return after
		}
		return unknown
	}
	alo, ahi := s.span(a)
	blo, bhi := s.span(b)
	switch {
	case ahi < math.MaxUint64-stampJitter && ahi+stampJitter < blo:
		return before
	case bhi < math.MaxUint64-stampJitter && bhi+stampJitter < alo:
		return after
	}
	return unknown
}

// span is when a record stamped ts happened, in ticks: its tick, or its
// epoch's start to its recorded end (unknown: any time).
func (s *Set) span(ts uint64) (lo, hi uint64) {
	if ts&format.TSEpoch == 0 {
		return ts, ts
	}
	e := ts &^ format.TSEpoch
	lo, hi = 0, math.MaxUint64
	if t, ok := s.tail.EpochTick[e]; ok {
		lo = t
	}
	if t, ok := s.tail.EpochEnd[e]; ok {
		hi = t
	}
	return lo, hi
}

// apply counts one MALLOC or FREE, in the merged order (merge.go).
func (s *Set) apply(r *item) {
	k := r.key
	if r.kind == itemFree {
		bp := s.blocks.Ptr(uint64(k)) // (one probe: changed in place)
		if bp == nil {
			// Allocated before the capture (or the window), or by
			// another thread later in this pass.
			delete(s.freed, r.tid)
			s.orphans[k] = append(s.orphans[k], orphanFree{r.ts, r.tid, s.pass})
			return
		}
		if o := s.order(r.ts, bp.ts); o == before || (o == unknown && bp.stale > 0 && r.tid != bp.tid) {
			// It freed an older block at this address, not this one
			// (allocated after it): one this block replaced, whose
			// thread's records were read later, or one allocated before
			// the capture.
			if bp.stale > 0 {
				bp.stale--
			}
			delete(s.freed, r.tid)
			return
		}
		s.freed[r.tid] = freedBlock{k, *bp}
		s.free(k)
		return
	}
	if r.kind == itemUndo {
		// A failed realloc: the block its thread just freed lives on.
		if f, ok := s.freed[r.tid]; ok && f.key == k {
			s.add(k, f.b, false)
		} else if q := s.orphansOf(k); len(q) > 0 && q[len(q)-1].tid == r.tid {
			s.orphans[k] = q[:len(q)-1] // that FREE did not happen
		}
		return
	}
	b := wBlock{size: r.size, site: r.site, tid: r.tid, ts: r.ts}
	s.add(k, b, true)
	// The address may have been reused many times: another thread's
	// FREEs of it are queued in its program order; the first that this
	// MALLOC may precede is its own (earlier ones were older blocks').
	q := s.orphansOf(k)
	if q == nil {
		return
	}
	for len(q) > 0 && (q[0].tid == r.tid || !s.freedFirst(q[0], r.ts)) {
		q = q[1:]
	}
	if len(q) > 0 {
		s.free(k) // its FREE came first in the spool
		q = q[1:]
	}
	if len(q) == 0 {
		delete(s.orphans, k)
	} else {
		s.orphans[k] = q
	}
}

// orphansOf is the FREEs without a block queued at k (nil: none, the
// common case, looked up without hashing).
func (s *Set) orphansOf(k spool.BlockKey) []orphanFree {
	if len(s.orphans) == 0 {
		return nil
	}
	return s.orphans[k]
}

// dropOrphans forgets, once more than maxOrphans addresses hold them, the
// FREEs that two catch-ups found no block for. Most freed blocks allocated
// before the capture (or the window), or mappings never recorded; but a
// MALLOC can still be unread then (the first half of a pair unit waits in
// its thread's ring until the thread records again), so they are kept
// while they are few: forgetting one whose MALLOC comes later would make
// that block read as live.
func (s *Set) dropOrphans() {
	if len(s.orphans) <= maxOrphans {
		return
	}
	for k, q := range s.orphans {
		i := 0
		for i < len(q) && q[i].pass < s.pass-1 {
			i++
		}
		if i == len(q) {
			delete(s.orphans, k)
		} else if i > 0 {
			s.orphans[k] = q[i:]
		}
	}
}

// maxOrphans bounds the addresses holding FREEs without a block (~100 bytes
// each). (A variable for the tests.)
var maxOrphans = 1 << 20

// free ends a block.
func (s *Set) free(k spool.BlockKey) {
	b, _ := s.blocks.Take(uint64(k))
	if b.site < 0 {
		return
	}
	if s.dirty {
		s.snapshot()
	}
	s.live -= b.size
	st := &s.sites[b.site]
	st.live -= b.size
	st.count--
}

// add adds a block (fresh: a new allocation, not a failed realloc's
// block living on).
func (s *Set) add(k spool.BlockKey, b wBlock, fresh bool) {
	if old := s.blocks.Ptr(uint64(k)); old != nil { // (one probe: changed in place)
		// The address's block was freed, but that FREE has not been
		// read: another thread's, whose records come later (or lost).
		if s.order(b.ts, old.ts) == before {
			// This MALLOC is the older one: its block is the one freed.
			old.stale++
			if fresh && b.site >= 0 {
				s.allocated += b.size
				s.nalloc++
			}
			return
		}
		b.stale = old.stale + 1 // (before free: it takes old's slot)
		s.free(k)
	}
	s.blocks.Put(uint64(k), b)
	if b.site < 0 {
		return
	}
	s.live += b.size
	s.sites[b.site].live += b.size
	s.sites[b.site].count++
	if fresh {
		s.allocated += b.size
		s.nalloc++
	}
	if s.live > s.peak {
		s.peak, s.dirty = s.live, s.peaks
	}
}

// site finds or adds the site of a MALLOC: its innermost Python frame
// outside msmemscope's own package, else the allocator's caller.
func (s *Set) site(r *spool.Rec) int32 {
	k := wSiteKey{csite: r.Site}
	var frames []spool.PyFrame
	if r.Flags&format.FCStack != 0 {
		if c, _ := r.Stacks(); r.Flags&format.FStackID != 0 && len(c) > 0 {
			k = wSiteKey{cstk: uint32(c[0])} // (its one unit is the id, not a frame)
		} else if len(c) > 0 {
			k = wSiteKey{cpc: c[0]}
		}
	}
	if r.Flags&format.FPyStack != 0 {
		_, py := r.Stacks()
		for j, f := range py {
			if c := s.tail.Py.Codes[f.Code]; c != nil && s.tail.Skipped(c.File) {
				continue
			}
			k = wSiteKey{code: f.Code, lasti: f.Lasti}
			frames = py[j:]
			break
		}
	}
	// A few recent sites by a cheap hash of the key, before the map's
	// (a loop's MALLOCs come from a few sites).
	slot := &s.recent[(k.csite^k.code^k.cstk^uint32(k.lasti)^uint32(k.cpc>>4))%uint32(len(s.recent))]
	if *slot > 0 && s.sites[*slot-1].key == k {
		return *slot - 1
	}
	if i, ok := s.index[k]; ok {
		*slot = i + 1
		return i
	}
	if len(frames) > maxStack {
		frames = frames[:maxStack]
	}
	s.sites = append(s.sites, wSite{key: k, frames: append([]spool.PyFrame(nil), frames...)})
	i := int32(len(s.sites) - 1)
	s.index[k] = i
	*slot = i + 1
	return i
}

// snapshot copies the per-site state at the peak.
func (s *Set) snapshot() {
	s.peakAt = append(s.peakAt[:0], s.sites...)
	s.dirty = false
}

// Site is one line of a report: a site's bytes and blocks, and a sample
// Python stack (innermost first) when there is one.
type Site struct {
	analyzer.SiteSize
	Stack []string `json:"stack"`
}

// namer names sites: Python frames from the code objects, C sites
// from the mappings now.
type namer struct {
	tail  *spool.Tail
	lines map[spool.PyFrame]int
	sym   *symbolize.Symbolizer
}

func newNamer(t *spool.Tail) *namer {
	return &namer{tail: t, lines: map[spool.PyFrame]int{}}
}

// report names the sites holding live bytes, largest first, the top of
// them (top <= 0: every one).
func (n *namer) report(all []wSite, top int) []Site {
	// The sites named by an interned C stack are one a frame, as the
	// dump's rows name them: the stacks of one innermost frame (the same
	// caller reached along other paths) together, and with that frame's
	// blocks recorded with whole stacks.
	sites := make([]wSite, 0, len(all))
	at := map[uint64]int{}
	for _, w := range all {
		if w.live == 0 {
			continue
		}
		if a, ok := n.tail.StackTop[w.key.cstk]; ok && w.key.cstk != 0 {
			w.key = wSiteKey{cpc: a}
		}
		if w.key.cpc != 0 {
			if j, ok := at[w.key.cpc]; ok {
				sites[j].live += w.live
				sites[j].count += w.count
				continue
			}
			at[w.key.cpc] = len(sites)
		}
		sites = append(sites, w)
	}
	idx := make([]int, len(sites))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return sites[idx[a]].live > sites[idx[b]].live })
	if top > 0 && len(idx) > top {
		idx = idx[:top]
	}
	out := make([]Site, 0, len(idx))
	for _, i := range idx {
		w := Site{SiteSize: analyzer.SiteSize{Size: sites[i].live, Count: sites[i].count}}
		w.Site, w.Function, w.Stack = n.name(&sites[i])
		out = append(out, w)
	}
	return out
}

// name names a site: its innermost Python frame, else the allocator's
// caller, as analyzer.SiteOf names an event's; and its sample stack.
func (n *namer) name(s *wSite) (site, function string, stack []string) {
	stack = []string{}
	if len(s.frames) > 0 {
		if txt := n.tail.Py.FormatPyStack(s.frames, n.lines); txt != "" {
			stack = strings.Split(txt, ";")
		}
	}
	var e trace.Event
	addr, ok := s.key.cpc, s.key.cpc != 0
	switch {
	case s.key.cstk != 0:
		// (not read yet, where another thread's MALLOC came first: unknown
		// until then, and named again)
		addr, ok = n.tail.StackTop[s.key.cstk]
	case !ok:
		addr, ok = n.tail.Sites[s.key.csite]
	}
	if len(stack) > 0 {
		e.PyStack = stack[0]
	} else if ok {
		if n.sym == nil {
			maps, _ := os.ReadFile("/proc/self/maps")
			n.sym = symbolize.New(string(maps))
		}
		e.Site = n.sym.Frame(addr)
	}
	site, function = analyzer.SiteOf(&e)
	return site, function, stack
}

// Blocks is how many blocks the sites hold.
func (s *Set) Blocks() int {
	n := 0
	for i := range s.sites {
		n += s.sites[i].count
	}
	return n
}

// Totals are a set's byte counts.
type Totals struct {
	Live, Peak, Allocated uint64 // Peak: the highest Live; Allocated: every block added
	Allocations           int
}

// Totals gives the set's byte counts.
func (s *Set) Totals() Totals {
	return Totals{Live: s.live, Peak: s.peak, Allocated: s.allocated, Allocations: s.nalloc}
}

// Offset is how much of the spool the catch-ups have read.
func (s *Set) Offset() int64 { return s.tail.Offset() }

// Named is the sites holding bytes at the peak and now, named, largest
// first, the top of each (top <= 0: every one).
func (s *Set) Named(top int) (atPeak, now []Site) {
	if s.dirty {
		s.snapshot()
	}
	n := newNamer(s.tail)
	return n.report(s.peakAt, top), n.report(s.sites, top)
}

// Report is get_mem_report's answer: every site holding bytes, one line per
// site and function, largest first. A site is named once (its code object
// or module does not change), unless it could not be named yet.
func (s *Set) Report() analyzer.MemReport {
	var namer *namer
	lines := make([]analyzer.SiteSize, 0, len(s.sites))
	for len(s.names) < len(s.sites) {
		s.names = append(s.names, analyzer.SiteSize{})
	}
	for i := range s.sites {
		st := &s.sites[i]
		if st.count == 0 {
			continue
		}
		l := &s.names[i]
		if l.Site == "" {
			if namer == nil {
				namer = newNamer(s.tail)
			}
			l.Site, l.Function, _ = namer.name(st)
		}
		lines = append(lines, analyzer.SiteSize{Site: l.Site, Function: l.Function, Size: st.live, Count: st.count})
		if l.Site == analyzer.UnknownSite {
			*l = analyzer.SiteSize{} // named again next time: its code object may have come since
		}
	}
	return analyzer.ReportOf(lines)
}
