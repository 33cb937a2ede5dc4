package livesites

import (
	"container/heap"
	"math"

	"msmemscope/format"
	"msmemscope/internal/u64map"
	"msmemscope/spool"
)

// A catch-up's records count in the order they happened, not the order
// the drain wrote them: the drain writes each thread's ring in turn, so a
// thread that ran first may be read last, and a peak or a block freed by
// another thread would be judged in that order (a producer's blocks freed
// by a consumer read first would never be live together: no peak).
//
// Each thread's records are in program order. When they happened: a
// precise stamp says; a record stamped with its drain epoch only happened
// after its thread's previous precise stamp (a thread's first record in
// an epoch, and every few records, is stamped precisely, and while two
// threads record every one is), so it takes that time. The threads' queues
// are merged by that time, earliest first (read order on a tie), except
// that a FREE of an address no block holds waits while another thread
// still has a MALLOC of that address to count that may have come before
// it (stamped before the FREE's latest possible time, with a TSC read's
// jitter): the FREE of a block handed on at once can read as earlier than
// its MALLOC. (A MALLOC later than that is a new block at a reused
// address: the FREE ended an older one.)
// The rules of apply (stale counts, orphans) still settle what the merge
// cannot: a record read in a later catch-up.

type itemKind uint8

const (
	itemMalloc itemKind = iota
	itemFree
	itemUndo // a failed realloc's MALLOC: the block just freed lives on
)

// item is a MALLOC or FREE waiting to count.
type item struct {
	key  spool.BlockKey
	size uint64
	ts   uint64 // its stamp as recorded
	t    uint64 // when it happened, for the merge (raw ticks)
	seq  uint64 // read order
	tid  int32
	site int32 // a MALLOC's site (-1: counts nothing)
	kind itemKind
}

// threadQ is one thread's records waiting, in program order (their times
// never decrease).
type threadQ struct {
	items []item
	head  int
}

// merger holds the records read and not yet counted.
type merger struct {
	threads map[int32]*threadQ // threads with records waiting
	last    map[int32]uint64   // each thread's latest time (see collect)
	n       int                // items waiting
	seq     uint64             // the next record's read order
	mallocs u64map.Map[int32]  // MALLOCs waiting, by address (mustWait's quick no)
	heap    qheap
	lastTid int32    // the thread of the last record queued,
	lastQ   *threadQ // and its queue
}

// Bounds of what a catch-up holds before counting: a first catch-up of a
// long run reads its whole spool. Beyond mergeMax items the earliest are
// counted, down to mergeKeep (the drain writes passes in time order, so
// only the latest pass's records can still be overtaken).
const (
	mergeMax  = 1 << 18
	mergeKeep = 1 << 16
)

// collect queues a MALLOC or FREE of the kinds kept.
func (s *Set) collect(r *spool.Rec) {
	if !s.subs(r.Flags & format.FSubMask) {
		return
	}
	m := &s.merge
	if m.threads == nil {
		m.threads, m.last = map[int32]*threadQ{}, map[int32]uint64{}
		m.mallocs.Runs, m.mallocs.Grain = true, 4
	}
	q := m.lastQ
	if q == nil || m.lastTid != r.Tid { // (a chunk's records are one thread's)
		if q = m.threads[r.Tid]; q == nil {
			q = &threadQ{}
			m.threads[r.Tid] = q
		}
		m.lastTid, m.lastQ = r.Tid, q
	}
	it := item{key: spool.KeyOf(r), ts: r.TS, tid: r.Tid, site: -1, seq: m.seq}
	m.seq++
	t, _ := s.span(r.TS) // its stamp, or its epoch's start
	it.t = max(m.last[r.Tid], t)
	m.last[r.Tid] = it.t
	switch {
	case r.Kind == format.RFree:
		it.kind = itemFree
	case r.Flags&format.FUndo != 0:
		it.kind = itemUndo
	default:
		it.size = spool.BlockSize(r)
		if r.Flags&(format.FOwn|format.FOff) == 0 {
			// (msmemscope's own blocks, and those allocated while
			// collection was off, make no row: counted nowhere.)
			it.site = s.site(r)
		}
		*m.mallocs.Slot(uint64(it.key))++
	}
	q.items = append(q.items, it)
	m.n++
	if m.n >= mergeMax {
		s.flush(mergeKeep)
	}
}

// flush counts the waiting records in time order until keep are left.
func (s *Set) flush(keep int) {
	m := &s.merge
	m.heap = m.heap[:0]
	for _, q := range m.threads {
		if q.head < len(q.items) {
			heap.Push(&m.heap, q)
		}
	}
	var waiting []*threadQ // threads whose next record is a FREE that must wait
	for m.n > keep {
		if len(m.heap) == 0 {
			if len(waiting) == 0 {
				break
			}
			// Every thread waits: the earliest goes (apply settles it).
			first := 0
			for i, q := range waiting {
				if q.less(waiting[first]) {
					first = i
				}
			}
			q := waiting[first]
			waiting = append(waiting[:first], waiting[first+1:]...)
			s.count(q)
			if q.head < len(q.items) {
				heap.Push(&m.heap, q)
			}
			continue
		}
		q := heap.Pop(&m.heap).(*threadQ)
		it := &q.items[q.head]
		if it.kind == itemFree && m.mustWait(s, it) {
			waiting = append(waiting, q)
			continue
		}
		malloc := it.kind == itemMalloc
		s.count(q)
		if q.head < len(q.items) {
			heap.Push(&m.heap, q)
		}
		if malloc && len(waiting) > 0 {
			// Its address may be what a waiting FREE waits for.
			for _, w := range waiting {
				heap.Push(&m.heap, w)
			}
			waiting = waiting[:0]
		}
	}
	for tid, q := range m.threads {
		// The rest at the front of its slice; a thread with none goes.
		n := copy(q.items, q.items[q.head:])
		q.items, q.head = q.items[:n], 0
		if n == 0 {
			delete(m.threads, tid)
		}
	}
	m.lastQ = nil // (maybe one of those gone)
	if keep == 0 && len(m.last) > maxThreadTimes {
		// A thread's time matters to its epoch-stamped records of the same
		// epoch only (its first in an epoch has a precise stamp): those of
		// threads quiet for a while go.
		var newest uint64
		for _, t := range m.last {
			newest = max(newest, t)
		}
		for tid, t := range m.last {
			if newest-t > quietTicks {
				delete(m.last, tid)
			}
		}
	}
}

// mustWait reports whether FREE it must wait: no block holds its address
// and another thread still has a MALLOC of it to count that may have come
// first (stamped up to the FREE's latest possible time and the jitter).
func (m *merger) mustWait(s *Set, it *item) bool {
	if s.blocks.Has(uint64(it.key)) {
		return false
	}
	if !m.mallocs.Has(uint64(it.key)) {
		return false
	}
	_, upto := s.span(it.ts)
	if upto < math.MaxUint64-stampJitter {
		upto += stampJitter
	}
	for tid, q := range m.threads {
		if tid == it.tid {
			continue
		}
		// Its records' times never decrease: those after upto cannot be.
		for j := q.head; j < len(q.items) && q.items[j].t <= upto; j++ {
			if o := &q.items[j]; o.kind == itemMalloc && o.key == it.key {
				return true
			}
		}
	}
	return false
}

// The threads' times kept (merger.last) beyond which those of threads
// quiet for quietTicks (~1 s at 3 GHz: many drain epochs) are dropped.
const (
	maxThreadTimes = 1024
	quietTicks     = 3_000_000_000
)

// count counts q's next record.
func (s *Set) count(q *threadQ) {
	m := &s.merge
	it := &q.items[q.head]
	q.head++
	m.n--
	if it.kind == itemMalloc {
		if p := m.mallocs.Ptr(uint64(it.key)); p != nil && *p > 1 {
			*p--
		} else {
			m.mallocs.Take(uint64(it.key))
		}
	}
	s.apply(it)
}

// less orders two threads by their next records: earliest, then read first.
func (q *threadQ) less(o *threadQ) bool {
	a, b := &q.items[q.head], &o.items[o.head]
	if a.t != b.t {
		return a.t < b.t
	}
	return a.seq < b.seq
}

// qheap is a min-heap of threads by their next record.
type qheap []*threadQ

func (h qheap) Len() int           { return len(h) }
func (h qheap) Less(i, j int) bool { return h[i].less(h[j]) }
func (h qheap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *qheap) Push(x any)        { *h = append(*h, x.(*threadQ)) }
func (h *qheap) Pop() any {
	old := *h
	q := old[len(old)-1]
	*h = old[:len(old)-1]
	return q
}
