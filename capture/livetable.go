package capture

import (
	"encoding/binary"

	"msmemscope/format"
	"msmemscope/internal/u64map"
	"msmemscope/spool"
)

// liveTable is where the rotator keeps each address's lastEvent (liveset.go)
// for every address live or freed since the cut before last: its state
// before the cut in one slice (no pointers, reused through a free list),
// found by key through an open-addressing index; its state after the cut,
// while a cut settles, in a second slice that the first points into
// (lastEvent.post: a map of them cost the drain an eighth of its time).
// The drain notes every MALLOC and FREE here: Go's map of allocated states
// spent a fifth of the drain's time, and ~220 bytes a live block.
type liveTable struct {
	idx  u64map.Map[uint32] // key → place, plus 1
	pre  [][]lastEvent      // by place, in slabs (a slice that doubled would hold up to twice its states, and three times while it grows)
	n    uint32             // places used or free
	post []lastEvent        // the events after the cut while it settles, each at its place's lastEvent.post-1
	free []uint32           // places free

	longs    [][]byte // MALLOC payloads longer than one unit (inline stacks), by mallocRec.long-1
	longFree []uint32
}

func newLiveTable() *liveTable {
	t := &liveTable{}
	t.idx.Runs, t.idx.Grain = true, 4 // addresses, 16-byte aligned, come in runs
	return t
}

// slabBits sets the slab: 4096 states, 416 KiB.
const slabBits = 12

// at is the state before the cut at place i.
func (t *liveTable) at(i uint32) *lastEvent { return &t.pre[i>>slabBits][i&(1<<slabBits-1)] }

// find is key's place, ok false if it has none.
func (t *liveTable) find(key spool.BlockKey) (uint32, bool) {
	if i := t.idx.Ptr(uint64(key)); i != nil {
		return *i - 1, true
	}
	return 0, false
}

// place is key's place, a zero state added if it had none.
func (t *liveTable) place(key spool.BlockKey) uint32 {
	i := t.idx.Slot(uint64(key))
	if *i == 0 {
		if n := len(t.free); n > 0 {
			*i = t.free[n-1] + 1
			t.free = t.free[:n-1]
		} else {
			if t.n>>slabBits == uint32(len(t.pre)) {
				t.pre = append(t.pre, make([]lastEvent, 1<<slabBits))
			}
			t.n++
			*i = t.n
		}
	}
	return *i - 1
}

// postAt is the state after the cut at place i, added if none.
func (t *liveTable) postAt(i uint32) *lastEvent {
	pre := t.at(i)
	if pre.post == 0 {
		t.post = append(t.post, lastEvent{})
		pre.post = uint32(len(t.post))
	}
	return &t.post[pre.post-1]
}

// postOf is the state after the cut at place i, nil if none.
func (t *liveTable) postOf(i uint32) *lastEvent {
	if p := t.at(i).post; p != 0 {
		return &t.post[p-1]
	}
	return nil
}

// each calls fn on every key held and its place.
func (t *liveTable) each(fn func(key spool.BlockKey, i uint32)) {
	t.idx.Each(func(k uint64, i *uint32) { fn(spool.BlockKey(k), *i-1) })
}

// remove forgets key, at place i (its state after the cut taken already).
func (t *liveTable) remove(key spool.BlockKey, i uint32) {
	t.idx.Take(uint64(key))
	t.dropLong(&t.at(i).rec)
	*t.at(i) = lastEvent{}
	t.free = append(t.free, i)
}

// mallocRec is a MALLOC kept whole (an address's latest, to repeat in
// later logs): its fields, its payload in place when it is one unit (a
// stack's id, as every compact MALLOC's), else in liveTable.longs.
type mallocRec struct {
	ts, b, pay uint64
	site       uint32
	long       uint32 // a longer payload: longs[long-1]; 0 none
	flags      uint16
	npay       uint8 // bytes of pay used
	ahi        uint8 // the address's bits 60-63, which its key leaves out (a VMM handle's, say)
}

// setRec makes m rec (a MALLOC) in place of the MALLOC it was.
func (t *liveTable) setRec(m *mallocRec, rec *spool.Rec) {
	t.dropLong(m)
	*m = mallocRec{ts: rec.TS, b: rec.B, site: rec.Site, flags: rec.Flags, ahi: uint8(rec.A >> 60)}
	switch n := len(rec.Payload); {
	case n == 0:
	case n <= 8:
		var u [8]byte
		copy(u[:], rec.Payload)
		m.pay, m.npay = binary.LittleEndian.Uint64(u[:]), uint8(n)
	default:
		if k := len(t.longFree); k > 0 {
			m.long = t.longFree[k-1] + 1
			t.longFree = t.longFree[:k-1]
			t.longs[m.long-1] = append(t.longs[m.long-1][:0], rec.Payload...)
		} else {
			t.longs = append(t.longs, append([]byte(nil), rec.Payload...))
			m.long = uint32(len(t.longs))
		}
	}
}

// payloadLen is the length of m's payload.
func (t *liveTable) payloadLen(m *mallocRec) int {
	if m.long != 0 {
		return len(t.longs[m.long-1])
	}
	return int(m.npay)
}

// dropLong frees m's long payload, if it has one.
func (t *liveTable) dropLong(m *mallocRec) {
	if m.long != 0 {
		t.longFree = append(t.longFree, m.long-1)
		m.long = 0
	}
}

// rec is the MALLOC at key's address as the spool's reader decodes it.
func (t *liveTable) rec(m *mallocRec, key spool.BlockKey) spool.Rec {
	r := spool.Rec{TS: m.ts, A: key.Ptr() | uint64(m.ahi)<<60, B: m.b, Kind: format.RMalloc, Flags: m.flags, Site: m.site}
	switch {
	case m.long != 0:
		r.Payload = t.longs[m.long-1]
	case m.npay > 0:
		u := make([]byte, 8)
		binary.LittleEndian.PutUint64(u, m.pay)
		r.Payload = u[:m.npay]
	}
	return r
}
