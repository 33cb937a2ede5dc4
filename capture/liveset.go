package capture

import (
	"encoding/binary"
	"sort"

	"msmemscope/format"
	"msmemscope/spool"
)

// The rotator's view of which blocks are live, kept so that each rotated
// log reads alone (SPEC §7): it repeats the blocks live when it began (its
// inherited blocks).
//
// The drain moves each thread's records at its own lag (a thread preempted
// between stamping an event and publishing it lags by as long as that
// takes), so the records of one address come in any order across threads:
// a FREE before the MALLOC it frees (a block handed to another thread), a
// MALLOC before the FREE of the block the address held before. So logs are
// cut by time, not by arrival: a new log begins at a drain epoch's start
// (the cut); the records stamped before it still go to the old log for
// rotateLagNs, those after it to the new one; then the new log gets its
// inherited blocks: each address left live by the MALLOCs and FREEs before
// the cut (they alternate on an address, so their count says it, whatever
// order their stamps give), with its latest MALLOC by time.
//
// A record that comes later still (stamped before the cut of the log it
// goes to) is counted (Rotator.Late). Where nothing happened on its address
// since, it reads right in its log (a FREE of a block the log inherited).
// Where the address's latest event is in an earlier log, the record is
// flagged format.FEarlier in its log (left out where that log is read
// first: its partner is not there) and copied to that earlier log in an
// AHED chunk (format.AheadMagic), which readers take only when that log is
// read alone. (The latest event need not be the record's partner: after
// records came that late, a log read alone can still be wrong, which
// rotate_late says.)

// rotateLagNs is how long records stamped before a cut may still come: the
// drain's passes (1 to 8 ms) and a thread preempted between stamping and
// publishing, with room.
const rotateLagNs = 50_000_000

// when is when a record happened as the rotator compares it: its precise
// stamp, or its epoch's start (raw ticks), and its thread and arrival order
// (a thread's records come in program order).
type when struct {
	t   uint64
	tid int32
	n   uint64
}

// before reports whether a happened before b.
func (a when) before(b when) bool {
	if a.tid != b.tid && a.t != b.t {
		return a.t < b.t
	}
	return a.n < b.n
}

// lastEvent is what the rotator knows of an address's MALLOCs and FREEs.
// Whether it is live is their balance, not which came last by stamp: the
// allocator alternates them on an address, whereas two threads' stamps
// within an unfenced TSC read's jitter (orderJitter in spool) can put a
// FREE before the MALLOC it frees (a block handed on at once).
//
// The rotator keeps one for every address live or recently freed (a
// million live blocks, a million of these, liveTable): its fields are
// ordered to leave little padding, and hold no pointer.
type lastEvent struct {
	at   when      // the latest event's time
	mAt  when      // the latest MALLOC by time: the block live, if one is
	rec  mallocRec // that MALLOC, whole
	bal  int32     // MALLOCs less FREEs noted (the state carried in counts as one)
	seq  int32     // the log the latest event went to
	post uint32    // while a cut settles: the state after it, in liveTable.post (plus 1; 0 none)
	set  bool
	free bool // whether the latest event by time is a FREE
	mSet bool // a MALLOC was noted
}

// note adds rec (a MALLOC or FREE) to l.
func (t *liveTable) note(l *lastEvent, rec *spool.Rec, at when, seq int) {
	if rec.Flags&format.FUndo != 0 { // a failed realloc: its FREE undone
		l.bal++
		if !l.set || !at.before(l.at) {
			l.set, l.free, l.at, l.seq = true, false, at, int32(seq)
		}
		return // (the block as its MALLOC recorded it)
	}
	free := rec.Kind == format.RFree
	if free {
		l.bal--
	} else {
		l.bal++
		if !l.mSet || !at.before(l.mAt) {
			l.mSet, l.mAt = true, at
			t.setRec(&l.rec, rec)
		}
	}
	if l.set && at.before(l.at) {
		return
	}
	l.set, l.free, l.at, l.seq = true, free, at, int32(seq)
}

// live reports whether the address holds a block after the events noted.
// A balance other than 0 or 1 means a record is missing (lost, or not yet
// come): then the latest event by time decides.
func (l *lastEvent) live() bool {
	switch l.bal {
	case 0:
		return false
	case 1:
		return l.mSet
	}
	return l.set && !l.free
}

// forgettable reports whether l's MALLOCs and FREEs paired and its latest
// event is a FREE: a record that comes later on its address is a later
// block's (sweep, settle).
func (l *lastEvent) forgettable() bool { return l.bal == 0 && l.free }

// keyPlace is an address and its place in the live table.
type keyPlace struct {
	k spool.BlockKey
	i uint32
}

// then is l followed by later events (n): the state l ends in, carried in.
// Its MALLOC is n's or l's (the other's long payload is still held).
func (l *lastEvent) then(n *lastEvent) lastEvent {
	live := l.live()
	out := *n
	if live {
		out.bal++
	}
	if !n.mSet && live {
		out.mSet, out.mAt, out.rec = true, l.mAt, l.rec
	}
	return out
}

// note records a MALLOC or FREE of key that went to log seq: in its state
// before the cut, or (post) after it.
func (r *Rotator) note(key spool.BlockKey, rec *spool.Rec, at when, seq int, post bool) {
	i := r.live.place(key)
	if post {
		r.live.note(r.live.postAt(i), rec, at, seq)
	} else {
		r.live.note(r.live.at(i), rec, at, seq)
	}
}

// late handles a MALLOC or FREE that came after its log's cut (stamped
// before it): it reports whether the record is flagged FEarlier, and
// queues its copy for the earlier log that holds its partner.
func (r *Rotator) late(key spool.BlockKey, at when, seq int, rec *spool.Rec) bool {
	r.Late++
	i, ok := r.live.find(key)
	if !ok {
		return false
	}
	pre := r.live.at(i)
	if !pre.set || !at.before(pre.at) || int(pre.seq) >= seq {
		// Nothing on its address since (a FREE of a block the log
		// inherited, a block live since), or what came since is in this
		// log: it reads right here.
		return false
	}
	r.addAhead(int(pre.seq), at.tid, rec)
	return true
}

// settle ends a cut: the blocks live before it are the new log's inherited
// ones (returned as INHR chunks, a thread's in a chunk of its own in
// address order, their MALLOCs flagged FInherit); then what came after it
// becomes the present, and addresses last freed before the previous cut
// are forgotten (no record that late is expected), as are those freed
// before this cut whose MALLOCs and FREEs paired, the latest a FREE: a
// record that comes later still is a later block's (a MALLOC older than a
// FREE seen leaves the balance at -1, kept). A program whose threads free each other's blocks
// touched a million addresses a log: the table held them all for two. The chunks are built
// in one buffer: with a million blocks live, a buffer per thread and a
// copy of them all held three times their size at once.
func (r *Rotator) settle() []byte {
	lt := r.live
	type keyAt struct {
		k   spool.BlockKey
		i   uint32
		tid int32
	}
	live := make([]keyAt, 0, lt.idx.Len()) // (no doubling: a million blocks live, a copy of 16 MB less)
	size := 0                              // the chunks' (a header each thread, counted below)
	lt.each(func(k spool.BlockKey, i uint32) {
		if pre := lt.at(i); pre.set && pre.live() {
			live = append(live, keyAt{k, i, pre.mAt.tid})
			size += spool.RecSize + (lt.payloadLen(&pre.rec)+spool.UnitSize-1)/spool.UnitSize*spool.UnitSize
		}
	})
	sort.Slice(live, func(a, b int) bool {
		if live[a].tid != live[b].tid {
			return live[a].tid < live[b].tid
		}
		return keyLess(live[a].k, live[b].k)
	})
	for j := range live {
		if j == 0 || live[j].tid != live[j-1].tid {
			size += spool.ChunkHdrSize
		}
	}
	out := make([]byte, 0, size)
	for j := 0; j < len(live); {
		tid, hdr := live[j].tid, len(out)
		out = spool.AppendChunk(out, format.InheritMagic, tid, nil) // its count and checksum below
		for ; j < len(live) && live[j].tid == tid; j++ {
			ka := live[j]
			b := lt.at(ka.i)
			rec := lt.rec(&b.rec, ka.k)
			rec.TS = 1 // live when this log began: readers date it first
			rec.Flags |= format.FInherit
			out = spool.AppendRec(out, &rec)
		}
		body := out[hdr+spool.ChunkHdrSize:]
		binary.LittleEndian.PutUint32(out[hdr+format.ChunkNUnitOff:], uint32(len(body)/spool.UnitSize))
		binary.LittleEndian.PutUint32(out[hdr+format.ChunkCRCOff:], spool.ChunkCRC(tid, body))
	}
	live = nil
	type keyPlace struct {
		k spool.BlockKey
		i uint32
	}
	var gone []keyPlace
	lt.each(func(k spool.BlockKey, i uint32) {
		pre := lt.at(i)
		balanced := false                      // its MALLOCs and FREEs paired, all before the cut
		if post := lt.postOf(i); post != nil { // later than anything before the cut
			merged := pre.then(post)
			if pre.rec.long != merged.rec.long {
				lt.dropLong(&pre.rec)
			}
			*pre = merged
		} else if pre.live() { // its balance 0 or 1 again
			pre.bal = 1
		} else {
			balanced = pre.forgettable()
			pre.bal = 0
		}
		if !pre.live() && (pre.at.t < r.prevCut || balanced && pre.at.t < r.cut) {
			gone = append(gone, keyPlace{k, i})
		}
	})
	lt.post = lt.post[:0]
	for _, ka := range gone {
		lt.remove(ka.k, ka.i)
	}
	r.prevCut = r.cut
	return out
}

// sweepFrom is the fewest addresses the live table holds before a sweep.
const sweepFrom = 1 << 16

// sweep forgets the addresses whose MALLOCs and FREEs paired and whose
// latest event is a FREE (none live there), but for those with events
// after a settling cut: a record that comes later on one is a later
// block's, as at a cut (settle). (Latest a MALLOC, a thread's earlier
// MALLOC of a block another thread freed could still come: it would then
// stand for the block live.) Without it a program whose threads
// free each other's blocks kept every address it touched over two logs
// (600 k addresses, 150 MB more RSS, for 4,000 blocks live). It runs when
// the table has doubled since the last sweep: a pass over the table for
// as many events at least.
func (r *Rotator) sweep() {
	lt := r.live
	if lt.idx.Len() < r.sweepAt {
		return
	}
	var gone []keyPlace
	lt.each(func(k spool.BlockKey, i uint32) {
		if pre := lt.at(i); pre.forgettable() && pre.post == 0 {
			gone = append(gone, keyPlace{k, i})
		}
	})
	for _, ka := range gone {
		lt.remove(ka.k, ka.i)
	}
	r.sweepAt = max(2*lt.idx.Len(), sweepFrom)
}

// keyLess orders blocks by address, then kind.
func keyLess(a, b spool.BlockKey) bool {
	if a.Ptr() != b.Ptr() {
		return a.Ptr() < b.Ptr()
	}
	return a.Sub() < b.Sub()
}

// LiveHost returns the host-heap blocks live after every record the rotator
// has seen (the leak-kind scan at exit reads them: with rotating logs, no
// one file holds the whole run).
func (r *Rotator) LiveHost() (blocks []LiveBlock) {
	r.live.each(func(k spool.BlockKey, i uint32) {
		if k.Sub() != format.FHost {
			return
		}
		l := *r.live.at(i)
		if post := r.live.postOf(i); post != nil {
			l = l.then(post)
		}
		if l.live() && l.mSet {
			blocks = append(blocks, LiveBlock{Addr: k.Ptr(), Size: l.rec.b, N: l.mAt.n})
		}
	})
	return blocks
}

// LiveBlock is a host-heap block live: its address and size, and its
// MALLOC's place among the records the rotator saw.
type LiveBlock struct{ Addr, Size, N uint64 }
