package spool

import (
	"math"
	"sort"

	"msmemscope/format"
)

// The merge of the threads' records into one stream, in an order the
// allocator allows (SPEC §2.1): for every block its MALLOC, then its FREE;
// a FREE before another thread's MALLOC of the same address.
//
// Each thread's records are in program order. Across threads the recorder
// gives each event either a precise stamp or only its drain epoch, and the
// merge estimates the time of the latter between the precise stamps around
// it. Estimates can put two threads' events on one address in the wrong
// order: a FREE ahead of the other thread's MALLOC it frees (a block handed
// through a queue), or a MALLOC ahead of the other thread's FREE whose
// memory it reuses. The consumer's allocator state (Reader.SetLive) decides:
// a record that the state does not allow yet — a FREE of an address not
// live, a MALLOC of an address another thread holds — is held back, with the
// rest of its thread, until a record on that address changes the state.
//
// Held back for how long is exact, not a time-out: the record truly
// happened by its bound hi (cursor.hi: the next precise stamp of its thread,
// or its epoch's end), and a record of another thread that can come before
// it must have its own lower bound lo below that. Once no other thread's
// next record has lo < hi, nothing can make the record valid: it is
// delivered as it is (Rec.Forced), and counted (OrderStats). Two records of
// one kind on one address whose bounds overlap (four threads touching an
// address within one stamp's window) admit two pairings: the merge takes
// the one its estimates give, and counts it as ambiguous.

// BlockKey names a block: its kind (format.FHost, FMmap) in the top four
// bits and its address below (user-space addresses need at most 57 bits).
// One integer, so that the maps keyed by it hash as fast as they can.
type BlockKey uint64

// MakeKey is the key of the block of kind sub (format.FSubMask bits) at ptr.
func MakeKey(sub uint16, ptr uint64) BlockKey {
	return BlockKey(ptr&(1<<60-1) | uint64(sub&format.FSubMask)<<60)
}

// Sub is the block's kind (format.FHost, FMmap).
func (k BlockKey) Sub() uint16 { return uint16(k >> 60) }

// Ptr is the block's address.
func (k BlockKey) Ptr() uint64 { return uint64(k) & (1<<60 - 1) }

// OrderStats counts what the ordering repair did and could not do.
// config.json writes it as "order".
type OrderStats struct {
	Reordered    uint64 `json:"reordered"`       // records held back until another thread's record on their address
	UnpairedFree uint64 `json:"unpaired_frees"`  // FREEs of an address no thread had allocated (before recording began, or a lost MALLOC)
	LostFree     uint64 `json:"lost_frees"`      // MALLOCs of an address another thread still held (that thread's FREE was never recorded)
	Ambiguous    uint64 `json:"ambiguous_order"` // records whose order on their address the stamps did not settle
}

// cursorHeap is a min-heap of cursors in the merge's order (Less2): the
// operations of container/heap, written for it, without the interface
// calls (a merge of two threads does one per record).
type cursorHeap []*threadCursor

// Less2 is the merge's order: by estimated time, then thread, then
// sequence, then the cursor's place (a thread's AHED and INHR chunks are
// cursors of their own, with its tid): a total order, so the merge does
// not hang on the heap's shape.
func (cursorHeap) Less2(a, b *threadCursor) bool {
	if a.ns != b.ns {
		return a.ns < b.ns
	}
	if a.tid != b.tid {
		return a.tid < b.tid
	}
	if a.seq != b.seq {
		return a.seq < b.seq
	}
	return a.idx < b.idx
}

func (h *cursorHeap) push(c *threadCursor) {
	*h = append(*h, c)
	h.up(len(*h) - 1)
}

func (h *cursorHeap) pop() *threadCursor {
	old := *h
	n := len(old) - 1
	c := old[0]
	old[0], old[n] = old[n], nil
	*h = old[:n]
	h.down(0)
	return c
}

// pushPop is push(c) then pop(), in one sift.
func (h cursorHeap) pushPop(c *threadCursor) *threadCursor {
	if len(h) == 0 || h.Less2(c, h[0]) {
		return c
	}
	c, h[0] = h[0], c
	h.down(0)
	return c
}

func (h cursorHeap) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.Less2(h[j], h[i]) {
			break
		}
		h[i], h[j] = h[j], h[i]
		j = i
	}
}

func (h cursorHeap) down(i int) {
	for n := len(h); ; {
		j := 2*i + 1
		if j >= n {
			return
		}
		if j2 := j + 1; j2 < n && h.Less2(h[j2], h[j]) {
			j = j2
		}
		if !h.Less2(h[j], h[i]) {
			return
		}
		h[i], h[j] = h[j], h[i]
		i = j
	}
}

// lastOn is the last record delivered on an address (a small direct-mapped
// cache: ambiguity needs only the recent past).
type lastOn struct {
	key    BlockKey
	tid    int32
	kind   uint16
	lo, hi uint64
}

const lastOnSlots = 1 << 14

// Reader yields every record of a spool, threads merged by time; each
// thread's own order is kept.
type Reader struct {
	s       *Spool
	h       cursorHeap
	last    *threadCursor
	init    bool
	live    func(BlockKey) bool
	parked  map[BlockKey][]*threadCursor
	nPark   int
	several bool     // the spool holds records of more than one thread
	wake    bool     // records wait on the address of the record last delivered
	wakeKey BlockKey // that address
	lastNs  uint64   // time of the last record handed out
	recent  []lastOn
	Stats   OrderStats
	// Earlier counts the records of a rotated log read first (alone, or
	// the oldest of several) that pair with a record of an earlier log:
	// left out, as that log is not read (format.FEarlier).
	Earlier uint64
}

// Reader starts a time-ordered pass over the spool.
func (s *Spool) Reader() *Reader {
	return &Reader{s: s, parked: map[BlockKey][]*threadCursor{}}
}

// SetLive gives the reader the consumer's allocator state: whether an
// address is live. The consumer updates it from each record before asking
// for the next. Without it the records come in estimated time order only.
func (r *Reader) SetLive(live func(BlockKey) bool) {
	r.live = live
	r.recent = make([]lastOn, lastOnSlots)
}

// KeyOf is the block a MALLOC or FREE record names.
func KeyOf(rec *Rec) BlockKey { return MakeKey(rec.Flags, rec.A) }

func recentSlot(k BlockKey) int {
	return int((uint64(k)>>4 ^ uint64(k.Sub())*0x9E3779B97F4A7C15) * 0x9E3779B97F4A7C15 >> 50)
}

// ordered reports whether rec is a MALLOC or FREE whose order the
// allocator's state checks (a failed realloc's or an inherited block's
// MALLOC is not a new allocation).
func ordered(rec *Rec) bool {
	switch rec.Kind {
	case format.RMalloc:
		return rec.Flags&(format.FUndo|format.FInherit) == 0
	case format.RFree:
		return true
	}
	return false
}

// blocked reports whether the allocator's state does not allow c's record
// yet, and counts an ambiguity when the record it would follow on its
// address was of its own kind, from another thread, with overlapping bounds.
func (r *Reader) blocked(c *threadCursor) bool {
	rec := c.cur
	if r.live == nil || rec.Forced || !ordered(rec) {
		return false
	}
	k := KeyOf(rec)
	// A MALLOC of a live address waits for its FREE (from any thread: the
	// holder may have handed the block on); a FREE for its MALLOC.
	wait := r.live(k) == (rec.Kind == format.RMalloc)
	if wait {
		lo, hi := c.tight()
		if p := &r.recent[recentSlot(k)]; p.key == k && p.kind == rec.Kind && p.tid != rec.Tid && p.lo <= hi && lo <= p.hi {
			r.Stats.Ambiguous++
		}
	}
	return wait
}

// orderJitter is how far apart two precise stamps must be for their order
// to count as settled: what an unfenced TSC read moves by in practice.
const orderJitter = 200

// tight is where c's record lies for counting ambiguities: its precise stamp
// give or take orderJitter (the middle of its bounds), else its bounds.
func (c *threadCursor) tight() (lo, hi uint64) {
	if c.cur.TS&TSEpoch != 0 {
		return c.lo, c.hi
	}
	mid := c.lo + (c.hi-c.lo)/2
	return max(c.lo, mid-min(mid, orderJitter)), min(c.hi, mid+orderJitter)
}

// park holds c back until a record on its address is delivered.
func (r *Reader) park(c *threadCursor) {
	k := KeyOf(c.cur)
	c.parkKey = k
	r.parked[k] = append(r.parked[k], c)
	r.nPark++
	r.Stats.Reordered++
}

// unpark puts c back in the merge, its record no earlier than the stream.
func (r *Reader) unpark(c *threadCursor) {
	r.nPark--
	if c.ns < r.lastNs {
		c.ns = r.lastNs
	}
	if c.floor < c.ns {
		c.floor = c.ns
	}
	r.h.push(c)
}

// wakeOn releases the cursors waiting on k: a record on k was delivered.
func (r *Reader) wakeOn(k BlockKey) {
	cs, ok := r.parked[k]
	if !ok {
		return
	}
	delete(r.parked, k)
	for _, c := range cs {
		r.unpark(c)
	}
}

// releaseStale delivers held-back records that nothing can make valid any
// more: no other thread's next record can have happened before them. When
// every cursor is held back (each waiting for a record behind another's),
// the one that happened earliest goes first.
func (r *Reader) releaseStale() {
	minHi := uint64(math.MaxUint64)
	for _, cs := range r.parked {
		for _, c := range cs {
			minHi = min(minHi, c.hi)
		}
	}
	// The heap's least estimate is no lower than its least lower bound:
	// nothing to do while it has not passed every held record's bound.
	if len(r.h) > 0 && r.h[0].ns <= minHi {
		return
	}
	activeLo := uint64(math.MaxUint64)
	for _, c := range r.h {
		activeLo = min(activeLo, c.lo)
	}
	var stale []*threadCursor
	for _, cs := range r.parked {
		for _, c := range cs {
			if activeLo > c.hi {
				stale = append(stale, c)
			}
		}
	}
	// A held record is released only when no other held record that may
	// still become valid could precede it. One at a time: the released
	// record's thread goes back into the merge, and its next records may
	// be what another held record waits for (its bound lo is then below
	// that record's hi), so nothing else is judged stale until it has run.
	// (By lower bound, then in the merge's order: records of one epoch
	// share their lower bound, and the choice must not hang on a map's
	// order.)
	sort.Slice(stale, func(i, j int) bool {
		if stale[i].lo != stale[j].lo {
			return stale[i].lo < stale[j].lo
		}
		return r.h.Less2(stale[i], stale[j])
	})
	for _, c := range stale {
		free := true
		for _, cs := range r.parked {
			for _, o := range cs {
				if o != c && o.lo < c.hi && activeLo <= o.hi {
					free = false
				}
			}
		}
		if free {
			r.release(c)
			return
		}
	}
	if len(r.h) == 0 && r.nPark > 0 {
		var first *threadCursor
		for _, cs := range r.parked {
			for _, c := range cs {
				if first == nil || c.lo < first.lo || c.lo == first.lo && c.tid < first.tid {
					first = c
				}
			}
		}
		r.release(first)
	}
}

// release delivers held-back c as it is.
func (r *Reader) release(c *threadCursor) {
	k := c.parkKey
	cs := r.parked[k]
	for i, o := range cs {
		if o == c {
			cs = append(cs[:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(r.parked, k)
	} else {
		r.parked[k] = cs
	}
	c.cur.Forced = true
	if c.cur.Kind == format.RFree {
		r.Stats.UnpairedFree++
	} else {
		r.Stats.LostFree++
	}
	r.unpark(c)
}

// Next returns the next record and its time in ns, or nil at the end. Times
// never decrease.
func (r *Reader) Next() (*Rec, uint64, error) {
	if !r.init {
		r.init = true
		tids := make([]int32, 0, len(r.s.threads))
		for t := range r.s.threads {
			tids = append(tids, t)
		}
		sort.Slice(tids, func(i, j int) bool { return tids[i] < tids[j] })
		var cs []*threadCursor
		for _, t := range tids {
			cs = append(cs, &threadCursor{tid: t, chunks: r.s.threads[t]})
		}
		for _, a := range r.s.ahead {
			cs = append(cs, &threadCursor{tid: a.tid, chunks: []chunkRef{a.ref}})
		}
		r.several = len(tids) > 1 || len(r.s.ahead) > 0
		for i, c := range cs {
			c.idx = i
			c.stacks, c.early = r.s.stacks, &r.Earlier
			ok, err := c.load(r.s)
			if err != nil {
				return nil, 0, err
			}
			if ok {
				r.h.push(c)
			}
		}
	}
	// fresh is the cursor of the record last delivered, moved on: it goes
	// first without a trip through the heap when it comes strictly before
	// the heap's first (one thread, or a thread's run of records between
	// others'); a tie goes through the heap, as it always did.
	var fresh *threadCursor
	if c := r.last; c != nil {
		r.last = nil
		ok, err := c.load(r.s)
		if err != nil {
			return nil, 0, err
		}
		if ok {
			c.seq++
			fresh = c
		}
	}
	if r.wake {
		r.wake = false
		r.wakeOn(r.wakeKey)
	}
	for {
		var c *threadCursor
		if fresh != nil && r.nPark == 0 {
			c, fresh = r.h.pushPop(fresh), nil // (fresh itself when it comes first)
		} else {
			if fresh != nil {
				r.h.push(fresh)
				fresh = nil
			}
			if r.nPark > 0 {
				r.releaseStale()
			}
			if len(r.h) == 0 {
				return nil, 0, nil
			}
			c = r.h.pop()
		}
		if r.blocked(c) {
			r.park(c)
			continue
		}
		if c.ns < r.lastNs {
			c.ns = r.lastNs
		}
		r.lastNs = c.ns
		r.last = c
		if r.live != nil && ordered(c.cur) {
			k := KeyOf(c.cur)
			if r.several { // (ambiguity is between threads)
				lo, hi := c.tight()
				r.recent[recentSlot(k)] = lastOn{key: k, tid: c.tid, kind: c.cur.Kind, lo: lo, hi: hi}
			}
			if r.nPark > 0 {
				if _, ok := r.parked[k]; ok {
					r.wakeKey, r.wake = k, true
				}
			}
		}
		return c.cur, c.ns, nil
	}
}
