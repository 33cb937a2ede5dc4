package libmemscope

/*
#include "pystack.h"
*/
import "C"

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"msmemscope/analyzer"
	"msmemscope/format"
	"msmemscope/spool"
	"msmemscope/symbolize"
	"msmemscope/trace"
)

// Measurement windows (msmemscope_window_begin / _end): what the process
// allocated between two calls — the peak of those blocks' live bytes, and
// those still live at the end — by allocation site. The pytest plugin
// measures each test with one. The spool is read as it grows (spool.Tail),
// so each window costs a drain and the events recorded since the last
// call, never a replay of the capture; the hot path does no extra work.
// Only blocks allocated inside the window count: a FREE of an older block
// changes nothing. Threads' events come in the order the drain wrote them,
// so another thread's FREE of a block may come before its MALLOC (in the
// same drain pass, or the next when the MALLOC came after its thread's
// ring was drained, or later still when a pass ends before a busy ring is
// empty): a FREE of an unknown address is kept for the window, and a later
// MALLOC of that address by another thread is taken as freed unless the
// stamps show it came after that FREE (then the FREE was an older
// block's) — never a leak invented.

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

type wBlock struct {
	size uint64
	site int32
}

var win struct {
	mu        sync.Mutex
	tail      *spool.Tail
	on        bool
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
	pass      int
}

// orphanFree is a FREE whose block the window has not seen (yet).
type orphanFree struct {
	ts   uint64
	tid  int32
	pass int
}

// freedFirst reports whether a MALLOC stamped m, read in this pass, came
// before the FREE o of its address: when both stamps are ticks, or both
// drain epochs only, they tell; otherwise a FREE of the last two passes is
// taken to be this block's.
func freedFirst(o orphanFree, m uint64) bool {
	if (o.ts^m)&format.TSEpoch != 0 {
		return o.pass >= win.pass-1
	}
	return m <= o.ts
}

// WindowSite is one line of a window's report: a site's bytes and blocks,
// and a sample Python stack (innermost first) when there is one.
type WindowSite struct {
	analyzer.SiteSize
	Stack []string `json:"stack"`
}

// WindowReport is msmemscope_window_end's result.
type WindowReport struct {
	PeakBytes      uint64       `json:"peak_bytes"`      // the highest live bytes of blocks allocated in the window
	LeakedBytes    uint64       `json:"leaked_bytes"`    // bytes allocated in the window and live at its end
	LeakedBlocks   int          `json:"leaked_blocks"`   // blocks of those
	AllocatedBytes uint64       `json:"allocated_bytes"` // every allocation in the window, freed or not
	Allocations    int          `json:"allocations"`
	PeakSites      []WindowSite `json:"peak_sites"` // live bytes per site at the peak, largest first
	LeakSites      []WindowSite `json:"leak_sites"` // live bytes per site at the end, largest first
}

// windowCatchUp drains the rings and reads the spool up to now (win.mu
// held). The window's state changes only while it is on.
func windowCatchUp() error {
	eng.mu.Lock()
	ok := eng.started && !eng.finished
	var dir string
	if ok {
		if eng.rot != nil {
			eng.mu.Unlock()
			return errors.New("measurement windows need log_mode=full (rotating logs cannot be read as they grow)")
		}
		dir = eng.proc.Dir
		drainNow()
	}
	eng.mu.Unlock()
	if !ok {
		return errors.New("no capture is running in this process")
	}
	if win.tail == nil {
		t, err := spool.OpenTail(filepath.Join(dir, spool.SpoolDir, spool.FileName))
		if err != nil {
			return err
		}
		win.tail = t
	}
	win.pass++
	return win.tail.Read(windowObserve)
}

func windowObserve(r *spool.Rec) {
	if !win.on {
		return
	}
	if sub := r.Flags & format.FSubMask; sub != format.FHost && sub != format.FMmap {
		return // device memory (a GPU's cache would read as every test's peak and leak)
	}
	k := spool.KeyOf(r) // as the decoder pairs: address and sub-type (HOST, MMAP)
	if r.Kind == format.RFree {
		if _, ok := win.blocks[k]; !ok {
			// Allocated before the window, or by another thread later in
			// this pass.
			win.orphans[k] = append(win.orphans[k], orphanFree{r.TS, r.Tid, win.pass})
			return
		}
		windowFree(k)
		return
	}
	// MALLOC: msmemscope's own blocks and failed reallocs make no row.
	if r.Flags&(format.FOwn|format.FUndo) != 0 {
		return
	}
	windowMalloc(r, k)
	// The address may have been reused many times: another thread's
	// FREEs of it are queued in its program order; the first that this
	// MALLOC may precede is its own (earlier ones were older blocks').
	q := win.orphans[k]
	for len(q) > 0 && (q[0].tid == r.Tid || !freedFirst(q[0], r.TS)) {
		q = q[1:]
	}
	if len(q) > 0 {
		windowFree(k) // its FREE came first in the spool
		q = q[1:]
	}
	if len(q) == 0 {
		delete(win.orphans, k)
	} else {
		win.orphans[k] = q
	}
}

// windowFree ends a block of the window.
func windowFree(k spool.BlockKey) {
	b := win.blocks[k]
	if win.dirty {
		windowSnapshot()
	}
	delete(win.blocks, k)
	win.live -= b.size
	s := &win.sites[b.site]
	s.live -= b.size
	s.count--
}

// windowMalloc adds a block to the window.
func windowMalloc(r *spool.Rec, k spool.BlockKey) {
	if _, ok := win.blocks[k]; ok { // a FREE was lost: the block is gone
		windowFree(k)
	}
	i := windowSite(r)
	win.blocks[k] = wBlock{r.B, i}
	win.live += r.B
	win.sites[i].live += r.B
	win.sites[i].count++
	win.allocated += r.B
	win.nalloc++
	if win.live > win.peak {
		win.peak, win.dirty = win.live, true
	}
}

// windowSite finds or adds the site of a MALLOC: its innermost Python
// frame outside msmemscope's own package, else the allocator's caller.
func windowSite(r *spool.Rec) int32 {
	k := wSiteKey{csite: r.Site}
	var frames []spool.PyFrame
	if r.Flags&format.FPyStack != 0 {
		_, py := r.Stacks()
		for j, f := range py {
			if c := win.tail.Py.Codes[f.Code]; c != nil && win.tail.Skipped(c.File) {
				continue
			}
			k = wSiteKey{code: f.Code, lasti: f.Lasti}
			frames = py[j:]
			break
		}
	}
	if i, ok := win.index[k]; ok {
		return i
	}
	if len(frames) > maxStack {
		frames = frames[:maxStack]
	}
	win.sites = append(win.sites, wSite{key: k, frames: append([]spool.PyFrame(nil), frames...)})
	i := int32(len(win.sites) - 1)
	win.index[k] = i
	return i
}

// windowSnapshot copies the per-site state at the peak.
func windowSnapshot() {
	win.peakAt = append(win.peakAt[:0], win.sites...)
	win.dirty = false
}

// WindowBegin starts a measurement window: from now on, blocks allocated
// are followed until WindowEnd.
func WindowBegin() error {
	win.mu.Lock()
	defer win.mu.Unlock()
	if C.ms_interposed() == 0 {
		return errors.New("measurement windows need libmemscope.so preloaded (the host heap is not interposed)")
	}
	win.on = false
	if err := windowCatchUp(); err != nil {
		return err
	}
	win.on = true
	win.blocks, win.index, win.sites, win.peakAt = map[spool.BlockKey]wBlock{}, map[wSiteKey]int32{}, nil, nil
	win.orphans = map[spool.BlockKey][]orphanFree{}
	win.live, win.peak, win.dirty, win.allocated, win.nalloc = 0, 0, false, 0, 0
	return nil
}

// WindowEnd ends the window and reports it, with the top sites of each
// list (top <= 0: every site).
func WindowEnd(top int) (WindowReport, error) {
	win.mu.Lock()
	defer win.mu.Unlock()
	if !win.on {
		return WindowReport{}, errors.New("no measurement window is open: call msmemscope_window_begin first")
	}
	err := windowCatchUp()
	win.on = false
	if err != nil {
		return WindowReport{}, err
	}
	if win.dirty {
		windowSnapshot()
	}
	names := newSiteNamer()
	rep := WindowReport{PeakBytes: win.peak, LeakedBytes: win.live, LeakedBlocks: len(win.blocks),
		AllocatedBytes: win.allocated, Allocations: win.nalloc}
	rep.PeakSites = names.report(win.peakAt, top)
	rep.LeakSites = names.report(win.sites, top)
	win.blocks, win.index, win.sites, win.peakAt = nil, nil, nil, nil
	return rep, nil
}

// siteNamer names sites: Python frames from the code objects, C sites
// from the mappings now.
type siteNamer struct {
	lines map[spool.PyFrame]int
	sym   *symbolize.Symbolizer
}

func newSiteNamer() *siteNamer { return &siteNamer{lines: map[spool.PyFrame]int{}} }

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
		s := &sites[i]
		w := WindowSite{SiteSize: analyzer.SiteSize{Size: s.live, Count: s.count}, Stack: []string{}}
		if len(s.frames) > 0 {
			if txt := win.tail.Py.FormatPyStack(s.frames, n.lines); txt != "" {
				w.Stack = strings.Split(txt, ";")
			}
		}
		var e trace.Event
		if len(w.Stack) > 0 {
			e.PyStack = w.Stack[0]
		} else if addr, ok := win.tail.Sites[s.key.csite]; ok {
			if n.sym == nil {
				maps, _ := os.ReadFile("/proc/self/maps")
				n.sym = symbolize.New(string(maps))
			}
			e.Site = n.sym.Frame(addr)
		}
		w.Site, w.Function = analyzer.SiteOf(&e)
		out = append(out, w)
	}
	return out
}
