package leakscan

import (
	"sort"
	"sync/atomic"

	"msmemscope/format"
	"msmemscope/internal/u64map"
	"msmemscope/spool"
)

// addrLife is what one pass over a spool knows of an address.
type addrLife struct {
	mallocs, frees uint32
	lastM          uint64 // the time of its latest MALLOC
	n              uint64 // that MALLOC's place among the records read
	size           uint64 // that MALLOC's size
}

// Live is the set of HOST blocks live in a spool file, kept up to date as
// the file grows: each Update reads only the whole chunks appended since
// the last one (spool.Tail). It reads each thread's records in order,
// without merging the threads by time: the allocator alternates MALLOCs and
// FREEs on an address, so their counts say whether it is live, whatever the
// order across threads (stamps only pick the latest MALLOC, whose size the
// block has). A block allocated before the capture and freed in it would
// count a FREE too many: the scan runs only where the capture began at the
// first allocation (the library preloaded or linked).
type Live struct {
	t         *spool.Tail
	lives     u64map.Map[addrLife] // by address
	n         uint64               // MALLOCs read
	lastEpoch uint64
	lastTick  uint64
	haveEpoch bool

	// Recent MALLOCs not yet counted in lives: a FREE of the same address
	// from the same thread cancels one, as the pair changes no count (the
	// thread freed that block, or one allocated after it: either way not
	// the block an address live at the end has). Most of a spool is such
	// pairs, which then never touch the map. Blocks counts what is left.
	pend    []pending // by address hash; addr 0: empty
	threads map[int32]*threadPend
	cur     *threadPend // the thread of the last record (chunks are per thread)
}

// pending is a MALLOC held back from lives.
type pending struct {
	addr, t, n, size uint64
	tid              int32
}

// threadPend is what a thread's next record may need of its past: the
// MALLOC its last FREE cancelled (a failed realloc's MALLOC, next in the
// thread's records, brings that block back).
type threadPend struct {
	tid  int32
	undo pending
}

const pendSlots = 4096

func pendSlot(addr uint64) int { return int((addr >> 4) * 0x9E3779B97F4A7C15 >> (64 - 12)) }

// OpenLive opens the spool file at path for Update reads, from its start.
func OpenLive(path string) (*Live, error) {
	t, err := spool.OpenTail(path)
	if err != nil {
		return nil, err
	}
	return &Live{t: t, lives: u64map.Map[addrLife]{Runs: true, Grain: 4}, pend: make([]pending, pendSlots),
		threads: map[int32]*threadPend{}}, nil
}

// Offset is how many bytes of the file the Updates have read.
func (l *Live) Offset() int64 { return l.t.Offset() }

// Close closes the file; Blocks still answers.
func (l *Live) Close() error { return l.t.Close() }

// Update reads the whole chunks the file holds beyond those read before (a
// chunk still being written is read by a later Update).
func (l *Live) Update() error { return l.UpdateUntil(nil) }

// UpdateUntil is Update that returns early, between two chunks, once stop
// is set (the next Update goes on from there).
func (l *Live) UpdateUntil(stop *atomic.Bool) error {
	return l.t.ReadUntil(stop, l.observe)
}

// observe counts one MALLOC or FREE.
func (l *Live) observe(rec *spool.Rec) {
	if rec.Flags&format.FSubMask != format.FHost {
		return
	}
	t := rec.TS
	if t&spool.TSEpoch != 0 {
		if e := t &^ spool.TSEpoch; e != l.lastEpoch || !l.haveEpoch {
			l.lastTick, l.haveEpoch = l.t.EpochTick[e]
			l.lastEpoch = e
		}
		t = l.lastTick // epochs change seldom: one lookup a run
	}
	th := l.cur
	if th == nil || th.tid != rec.Tid {
		if th = l.threads[rec.Tid]; th == nil {
			th = &threadPend{tid: rec.Tid}
			l.threads[rec.Tid] = th
		}
		l.cur = th
	}
	p := &l.pend[pendSlot(rec.A)]
	if rec.Kind == format.RFree {
		if p.addr == rec.A && p.tid == rec.Tid && rec.A != 0 {
			th.undo, *p = *p, pending{} // the pair cancels
			return
		}
		th.undo = pending{}
		l.lives.Slot(rec.A).frees++
		return
	}
	l.n++
	undo := th.undo
	th.undo = pending{}
	if rec.Flags&format.FUndo != 0 {
		// A failed realloc's MALLOC brings back the block just freed, at its
		// size: the MALLOC its FREE cancelled is held again.
		if undo.addr == rec.A && rec.A != 0 {
			l.hold(p, undo)
			return
		}
		l.lives.Slot(rec.A).mallocs++
		return
	}
	if rec.A == 0 {
		l.count(pending{t: t, n: l.n, size: rec.B})
		return
	}
	l.hold(p, pending{addr: rec.A, t: t, n: l.n, size: rec.B, tid: rec.Tid})
}

// hold puts m in its slot p, counting the MALLOC held there before.
func (l *Live) hold(p *pending, m pending) {
	if p.addr != 0 {
		l.count(*p)
	}
	*p = m
}

// count adds a MALLOC to lives. The block an address holds is its latest
// MALLOC's: by stamp, and among equal stamps (an epoch's compact records
// share its start) the one read last, whatever order they are counted in.
func (l *Live) count(m pending) {
	a := l.lives.Slot(m.addr)
	a.mallocs++
	if a.mallocs == 1 || m.t > a.lastM || m.t == a.lastM && m.n > a.n {
		a.lastM, a.size, a.n = m.t, m.size, m.n
	}
}

// Blocks returns the blocks live after the chunks read, by address.
func (l *Live) Blocks() []Block {
	for i := range l.pend {
		if l.pend[i].addr != 0 {
			l.count(l.pend[i])
			l.pend[i] = pending{}
		}
	}
	var out []Block
	l.lives.Each(func(a uint64, b *addrLife) {
		if b.live() {
			out = append(out, Block{Addr: a, Size: b.size, N: b.n})
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// LiveFromSpool returns the HOST blocks live at the end of a spool file, by
// address, reading what the file holds when it starts (threads still
// running may append).
func LiveFromSpool(path string) ([]Block, error) {
	l, err := OpenLive(path)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if err := l.Update(); err != nil {
		return nil, err
	}
	return l.Blocks(), nil
}

func (l *addrLife) live() bool { return l.mallocs > l.frees }
