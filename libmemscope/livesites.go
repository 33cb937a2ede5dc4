package libmemscope

import (
	"os"
	"sort"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/format"
	"msmemscope/spool"
	"msmemscope/symbolize"
	"msmemscope/trace"
)

// liveSites is the live bytes per allocation site of a running capture,
// kept as the spool grows (spool.Tail): each catch-up reads only what the
// drain wrote since the last one, never a replay. Two readers keep one:
// a measurement window (window.go: the blocks allocated between two calls,
// and their peak) and get_mem_report (report_api.go: every block of the
// capture).
//
// Threads' records come in the order the drain wrote them, so another
// thread's FREE of a block may come before its MALLOC (in the same drain
// pass, or the next when the MALLOC came after its thread's ring was
// drained, or later still when a pass ends before a busy ring is empty): a
// FREE of an unknown address is kept, and a later MALLOC of that address
// by another thread is taken as freed unless the stamps show it came after
// that FREE (then the FREE was an older block's) — never a leak invented.
type liveSites struct {
	tail      *spool.Tail
	subs      func(sub uint16) bool // the kinds of memory kept (format.FSubMask)
	blocks    map[spool.BlockKey]wBlock
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
}

// maxStack is how many Python frames a site keeps for its report.
const maxStack = 8

type wSiteKey struct {
	code  uint32 // innermost Python frame's code id (0: no Python stack)
	lasti int32
	csite uint32 // the allocator's caller (its site id) when no Python frame
}

type wSite struct {
	key    wSiteKey
	frames []spool.PyFrame // a sample stack, innermost first
	live   uint64
	count  int
}

// wBlock is a live block: its size and site; site -1 is a block that
// counts nothing but is tracked so that its FREE pairs (msmemscope's own,
// or allocated while collection was off).
type wBlock struct {
	size uint64
	site int32
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

func newLiveSites(t *spool.Tail, subs func(uint16) bool) *liveSites {
	return &liveSites{tail: t, subs: subs, blocks: map[spool.BlockKey]wBlock{}, index: map[wSiteKey]int32{},
		orphans: map[spool.BlockKey][]orphanFree{}, freed: map[int32]freedBlock{}}
}

// catchUp reads what the spool holds beyond the last catch-up.
func (s *liveSites) catchUp() error {
	s.pass++
	return s.tail.Read(s.observe)
}

// freedFirst reports whether a MALLOC stamped m, read in this pass, came
// before the FREE o of its address: when both stamps are ticks, or both
// drain epochs only, they tell; otherwise a FREE of the last two passes is
// taken to be this block's.
func (s *liveSites) freedFirst(o orphanFree, m uint64) bool {
	if (o.ts^m)&format.TSEpoch != 0 {
		return o.pass >= s.pass-1
	}
	return m <= o.ts
}

func (s *liveSites) observe(r *spool.Rec) {
	if !s.subs(r.Flags & format.FSubMask) {
		return
	}
	k := spool.KeyOf(r) // as the decoder pairs: address and sub-type
	if r.Kind == format.RFree {
		if _, ok := s.blocks[k]; !ok {
			// Allocated before the capture (or the window), or by
			// another thread later in this pass.
			delete(s.freed, r.Tid)
			s.orphans[k] = append(s.orphans[k], orphanFree{r.TS, r.Tid, s.pass})
			return
		}
		s.freed[r.Tid] = freedBlock{k, s.blocks[k]}
		s.free(k)
		return
	}
	if r.Flags&format.FUndo != 0 {
		// A failed realloc: the block its thread just freed lives on.
		if f, ok := s.freed[r.Tid]; ok && f.key == k {
			s.add(k, f.b)
		}
		return
	}
	var b wBlock
	if r.Flags&(format.FOwn|format.FOff) != 0 {
		// msmemscope's own block, or one allocated while collection was
		// off: no row, so counted nowhere.
		b = wBlock{blockSize(r), -1}
	} else {
		b = wBlock{blockSize(r), s.site(r)}
	}
	s.add(k, b)
	// The address may have been reused many times: another thread's
	// FREEs of it are queued in its program order; the first that this
	// MALLOC may precede is its own (earlier ones were older blocks').
	q := s.orphans[k]
	for len(q) > 0 && (q[0].tid == r.Tid || !s.freedFirst(q[0], r.TS)) {
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

// blockSize is a MALLOC's size (a device block's record carries its device
// and kind above the size).
func blockSize(r *spool.Rec) uint64 {
	switch r.Flags & format.FSubMask {
	case format.FHal, format.FVmm, format.FPinned:
		return r.B & format.DevBSize
	}
	return r.B
}

// free ends a block.
func (s *liveSites) free(k spool.BlockKey) {
	b := s.blocks[k]
	delete(s.blocks, k)
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

// add adds a block.
func (s *liveSites) add(k spool.BlockKey, b wBlock) {
	if _, ok := s.blocks[k]; ok { // a FREE was lost: the block is gone
		s.free(k)
	}
	s.blocks[k] = b
	if b.site < 0 {
		return
	}
	s.live += b.size
	s.sites[b.site].live += b.size
	s.sites[b.site].count++
	s.allocated += b.size
	s.nalloc++
	if s.live > s.peak {
		s.peak, s.dirty = s.live, true
	}
}

// site finds or adds the site of a MALLOC: its innermost Python frame
// outside msmemscope's own package, else the allocator's caller.
func (s *liveSites) site(r *spool.Rec) int32 {
	k := wSiteKey{csite: r.Site}
	var frames []spool.PyFrame
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
	if i, ok := s.index[k]; ok {
		return i
	}
	if len(frames) > maxStack {
		frames = frames[:maxStack]
	}
	s.sites = append(s.sites, wSite{key: k, frames: append([]spool.PyFrame(nil), frames...)})
	i := int32(len(s.sites) - 1)
	s.index[k] = i
	return i
}

// snapshot copies the per-site state at the peak.
func (s *liveSites) snapshot() {
	s.peakAt = append(s.peakAt[:0], s.sites...)
	s.dirty = false
}

// WindowSite is one line of a report: a site's bytes and blocks, and a
// sample Python stack (innermost first) when there is one.
type WindowSite struct {
	analyzer.SiteSize
	Stack []string `json:"stack"`
}

// siteNamer names sites: Python frames from the code objects, C sites
// from the mappings now.
type siteNamer struct {
	tail  *spool.Tail
	lines map[spool.PyFrame]int
	sym   *symbolize.Symbolizer
}

func newSiteNamer(t *spool.Tail) *siteNamer {
	return &siteNamer{tail: t, lines: map[spool.PyFrame]int{}}
}

// report names the sites holding live bytes, largest first, the top of
// them (top <= 0: every one).
func (n *siteNamer) report(sites []wSite, top int) []WindowSite {
	idx := make([]int, 0, len(sites))
	for i := range sites {
		if sites[i].live > 0 {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return sites[idx[a]].live > sites[idx[b]].live })
	if top > 0 && len(idx) > top {
		idx = idx[:top]
	}
	out := make([]WindowSite, 0, len(idx))
	for _, i := range idx {
		w := WindowSite{SiteSize: analyzer.SiteSize{Size: sites[i].live, Count: sites[i].count}}
		w.Site, w.Function, w.Stack = n.name(&sites[i])
		out = append(out, w)
	}
	return out
}

// name names a site: its innermost Python frame, else the allocator's
// caller, as analyzer.SiteOf names an event's; and its sample stack.
func (n *siteNamer) name(s *wSite) (site, function string, stack []string) {
	stack = []string{}
	if len(s.frames) > 0 {
		if txt := n.tail.Py.FormatPyStack(s.frames, n.lines); txt != "" {
			stack = strings.Split(txt, ";")
		}
	}
	var e trace.Event
	if len(stack) > 0 {
		e.PyStack = stack[0]
	} else if addr, ok := n.tail.Sites[s.key.csite]; ok {
		if n.sym == nil {
			maps, _ := os.ReadFile("/proc/self/maps")
			n.sym = symbolize.New(string(maps))
		}
		e.Site = n.sym.Frame(addr)
	}
	site, function = analyzer.SiteOf(&e)
	return site, function, stack
}

// liveBlocks is how many blocks the sites hold.
func (s *liveSites) liveBlocks() int {
	n := 0
	for i := range s.sites {
		n += s.sites[i].count
	}
	return n
}
