package capture

import (
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
// million live blocks, a million of these): its fields are ordered to
// leave no padding.
type lastEvent struct {
	at   when   // the latest event's time
	mAt  when   // the latest MALLOC by time: the block live, if one is
	rec  []byte // that MALLOC, whole
	bal  int32  // MALLOCs less FREEs noted (the state carried in counts as one)
	seq  int32  // the log the latest event went to
	set  bool
	free bool // whether the latest event by time is a FREE
	mSet bool // a MALLOC was noted
}

// note adds rec (a MALLOC or FREE).
func (l *lastEvent) note(rec *spool.Rec, at when, seq int) {
	free := rec.Kind == format.RFree
	if free {
		l.bal--
	} else {
		l.bal++
		if !l.mSet || !at.before(l.mAt) {
			l.mSet, l.mAt = true, at
			l.rec = spool.AppendRec(l.rec[:0], rec)
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

// then is l followed by later events (n): the state l ends in, carried in.
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

// addrState is an address's latest event before the cut (pre) and, while a
// cut waits for late records, after it (post: nil while none came).
type addrState struct {
	pre  lastEvent
	post *lastEvent
}

// note records a MALLOC or FREE of key that went to log seq.
func (r *Rotator) note(key spool.BlockKey, rec *spool.Rec, at when, seq int, post bool) {
	st := r.live[key]
	if st == nil {
		st = &addrState{}
		r.live[key] = st
	}
	if post {
		if st.post == nil {
			st.post = &lastEvent{}
		}
		st.post.note(rec, at, seq)
	} else {
		st.pre.note(rec, at, seq)
	}
}

// late handles a MALLOC or FREE that came after its log's cut (stamped
// before it): it reports whether the record is flagged FEarlier, and
// queues its copy for the earlier log that holds its partner.
func (r *Rotator) late(key spool.BlockKey, at when, seq int, rec *spool.Rec) bool {
	r.Late++
	st := r.live[key]
	if st == nil || !st.pre.set || !at.before(st.pre.at) || int(st.pre.seq) >= seq {
		// Nothing on its address since (a FREE of a block the log
		// inherited, a block live since), or what came since is in this
		// log: it reads right here.
		return false
	}
	r.addAhead(int(st.pre.seq), at.tid, rec)
	return true
}

// settle ends a cut: the blocks live before it are the new log's inherited
// ones (returned, by thread, as full records flagged FInherit); then what
// came after it becomes the present, and addresses last freed before the
// previous cut are forgotten (no record that late is expected).
func (r *Rotator) settle() map[int32][]byte {
	keys := make([]spool.BlockKey, 0, len(r.live))
	for k, st := range r.live {
		if st.pre.set && st.pre.live() {
			keys = append(keys, k)
		}
	}
	sortKeys(keys)
	inherited := map[int32][]byte{}
	for _, k := range keys {
		b := &r.live[k].pre
		rec, _, _ := spool.DecodeRec(b.rec, 0, 0) // a full record
		rec.TS = 1                                // live when this log began: readers date it first
		rec.Flags |= format.FInherit
		inherited[b.mAt.tid] = spool.AppendRec(inherited[b.mAt.tid], &rec)
	}
	for k, st := range r.live {
		if st.post != nil { // later than anything before the cut
			st.pre, st.post = st.pre.then(st.post), nil
		} else if st.pre.live() { // its balance 0 or 1 again
			st.pre.bal = 1
		} else {
			st.pre.bal = 0
		}
		if !st.pre.live() && st.pre.at.t < r.prevCut {
			delete(r.live, k)
		}
	}
	r.prevCut = r.cut
	return inherited
}

func sortKeys(keys []spool.BlockKey) {
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Ptr() != keys[j].Ptr() {
			return keys[i].Ptr() < keys[j].Ptr()
		}
		return keys[i].Sub() < keys[j].Sub()
	})
}

// LiveHost returns the host-heap blocks live after every record the rotator
// has seen (the leak-kind scan at exit reads them: with rotating logs, no
// one file holds the whole run).
func (r *Rotator) LiveHost() (blocks []LiveBlock) {
	for k, st := range r.live {
		if k.Sub() != format.FHost {
			continue
		}
		l := st.pre
		if st.post != nil {
			l = st.pre.then(st.post)
		}
		if !l.live() || !l.mSet {
			continue
		}
		rec, _, ok := spool.DecodeRec(l.rec, 0, 0)
		if !ok {
			continue
		}
		blocks = append(blocks, LiveBlock{Addr: k.Ptr(), Size: rec.B, N: l.mAt.n})
	}
	return blocks
}

// LiveBlock is a host-heap block live: its address and size, and its
// MALLOC's place among the records the rotator saw.
type LiveBlock struct{ Addr, Size, N uint64 }
