package analyzer

import (
	"math"

	"msmemscope/internal/u64map"
)

// leakLive holds the leaks analysis's live blocks: a million of them is
// common (a Python program's objects), so a block is 72 bytes without
// pointers for the collector to scan, its strings interned (they repeat:
// types, devices, owners, memoized stacks), kept in fixed chunks that never
// move, found by allocation id.
type leakLive struct {
	// The latest blocks, by allocation id modulo recentSlots: most blocks
	// of an allocation loop are freed within a few hundred allocations,
	// and then never touch ids or chunks. A block moves on to them when a
	// later id takes its slot.
	recent   []leakBlock
	recentID []uint64 // the slot's allocation id + 1 (0: empty)
	waiting  int      // blocks in recent of step ≥ 2 not judged (LeakAnalyzer.endStep looks only if any)

	ids    u64map.Map[int32] // allocation id -> entry
	chunks [][]leakBlock
	unused []int32 // entries free for the next MALLOC
	strs   []string
	strIdx map[string]uint32
	last   [liveStrs]struct { // per string field, the last one interned
		s string
		i uint32
	}
}

const (
	recentSlots = 4096
	liveChunk   = 4096
	liveStrs    = 5 // Type, Device, Owner, PyStack, CStack
)

type leakBlock struct {
	allocID, ptr, size, mallocID, ts uint64
	step                             int64
	str                              [liveStrs]uint32
	judged                           bool // reported as a step leak (LeakAnalyzer.endStep) while in recent
}

func (l *leakLive) at(i int32) *leakBlock { return &l.chunks[i/liveChunk][i%liveChunk] }

func (l *leakLive) intern(field int, s string) uint32 {
	c := &l.last[field]
	if s == c.s {
		return c.i
	}
	i, ok := l.strIdx[s]
	if !ok {
		i = uint32(len(l.strs))
		l.strs = append(l.strs, s)
		l.strIdx[s] = i
	}
	c.s, c.i = s, i
	return i
}

// add records a block (replacing none: the caller removed any of its id).
// It returns the block it moved out of recent (moved), unless judged.
func (l *leakLive) add(k Leak) (moved *leakBlock) {
	if l.strs == nil {
		l.strIdx, l.strs = map[string]uint32{"": 0}, []string{""} // "" is 0, as last starts
		l.ids.Runs = true
		l.recent, l.recentID = make([]leakBlock, recentSlots), make([]uint64, recentSlots)
	}
	b := leakBlock{allocID: k.AllocID, ptr: k.Ptr, size: k.Size, mallocID: k.MallocID, ts: k.Timestamp, step: int64(k.Step),
		str: [liveStrs]uint32{l.intern(0, k.Type), l.intern(1, k.Device), l.intern(2, k.Owner), l.intern(3, k.PyStack), l.intern(4, k.CStack)}}
	if k.AllocID == math.MaxUint64 { // its id + 1 would read as an empty slot
		return l.keep(&b)
	}
	r := int(k.AllocID % recentSlots)
	if l.recentID[r] != 0 {
		l.unwait(&l.recent[r])
		moved = l.keep(&l.recent[r])
	}
	l.recentID[r] = k.AllocID + 1
	l.recent[r] = b
	if b.step >= 2 {
		l.waiting++
	}
	if moved != nil && moved.judged {
		moved = nil
	}
	return moved
}

// unwait notes that a block of recent leaves it or is judged.
func (l *leakLive) unwait(b *leakBlock) {
	if b.step >= 2 && !b.judged {
		l.waiting--
	}
}

// eachRecent calls fn on every block in recent.
func (l *leakLive) eachRecent(fn func(*leakBlock)) {
	for r, id := range l.recentID {
		if id != 0 {
			fn(&l.recent[r])
		}
	}
}

// keep moves a block out of recent into the chunks, and returns it there.
func (l *leakLive) keep(b *leakBlock) *leakBlock {
	var i int32
	if n := len(l.unused); n > 0 {
		i, l.unused = l.unused[n-1], l.unused[:n-1]
	} else {
		n := 0
		if len(l.chunks) > 0 {
			n = len(l.chunks[len(l.chunks)-1])
		}
		if len(l.chunks) == 0 || n == liveChunk {
			l.chunks = append(l.chunks, make([]leakBlock, 0, liveChunk))
			n = 0
		}
		c := &l.chunks[len(l.chunks)-1]
		*c = append(*c, leakBlock{})
		i = int32((len(l.chunks)-1)*liveChunk + n)
	}
	*l.at(i) = *b
	l.ids.Put(b.allocID, i)
	return l.at(i)
}

// inRecent returns id's slot if its block is in recent.
func (l *leakLive) inRecent(id uint64) (int, bool) {
	r := int(id % recentSlots)
	return r, l.recentID != nil && id != math.MaxUint64 && l.recentID[r] == id+1
}

// take removes the block of id and returns its step.
func (l *leakLive) take(id uint64) (step int, ok bool) {
	if r, ok := l.inRecent(id); ok {
		l.recentID[r] = 0
		l.unwait(&l.recent[r])
		return int(l.recent[r].step), true
	}
	i, ok := l.ids.Take(id)
	if !ok {
		return 0, false
	}
	l.unused = append(l.unused, i)
	return int(l.at(i).step), true
}

// get returns the block of id.
func (l *leakLive) get(id uint64) (Leak, bool) {
	if r, ok := l.inRecent(id); ok {
		return l.leak(&l.recent[r]), true
	}
	i, ok := l.ids.Get(id)
	if !ok {
		return Leak{}, false
	}
	return l.leak(l.at(i)), true
}

func (l *leakLive) leak(b *leakBlock) Leak {
	return Leak{AllocID: b.allocID, Ptr: b.ptr, Size: b.size, Step: int(b.step),
		Type: l.strs[b.str[0]], Device: l.strs[b.str[1]], Owner: l.strs[b.str[2]], PyStack: l.strs[b.str[3]], CStack: l.strs[b.str[4]],
		MallocID: b.mallocID, Timestamp: b.ts}
}

// each calls fn on every live block.
func (l *leakLive) each(fn func(Leak)) {
	l.ids.Each(func(_ uint64, i *int32) { fn(l.leak(l.at(*i))) })
	l.eachRecent(func(b *leakBlock) { fn(l.leak(b)) })
}
