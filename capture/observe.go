package capture

import (
	"encoding/binary"
	"fmt"

	"msmemscope/format"
	"msmemscope/spool"
)

// logOut builds one batch's chunks for one log.
type logOut struct {
	buf []byte
	hdr int // where the open chunk's header is, -1: none
	tid int32
}

func (o *logOut) reset() { o.buf, o.hdr = o.buf[:0], -1 }

// chunk makes sure the open chunk is tid's.
func (o *logOut) chunk(tid int32) {
	if o.hdr >= 0 && o.tid == tid {
		return
	}
	o.close()
	o.hdr, o.tid = len(o.buf), tid
	o.buf = spool.AppendChunk(o.buf, format.ChunkMagic, tid, nil) // its count set by close
}

// close ends the open chunk (none if it is empty): its count and checksum.
func (o *logOut) close() {
	if o.hdr < 0 {
		return
	}
	if n := (len(o.buf) - o.hdr - spool.ChunkHdrSize) / spool.UnitSize; n == 0 {
		o.buf = o.buf[:o.hdr]
	} else {
		binary.LittleEndian.PutUint32(o.buf[o.hdr+format.ChunkNUnitOff:], uint32(n))
		binary.LittleEndian.PutUint32(o.buf[o.hdr+format.ChunkCRCOff:], spool.ChunkCRC(o.tid, o.buf[o.hdr+spool.ChunkHdrSize:]))
	}
	o.hdr = -1
}

// timeOf is when rec happened in raw ticks: its precise stamp, else the
// start of its epoch (0: unknown, long ago).
func (r *Rotator) timeOf(rec *spool.Rec) uint64 {
	if rec.TS&spool.TSEpoch == 0 {
		return rec.TS
	}
	e := rec.TS &^ spool.TSEpoch
	if e != r.lastEpoch || !r.lastEpochOK { // (a thread's records share their epoch, mostly)
		r.lastEpoch, r.lastEpochOK = e, true
		r.lastEpochTick = r.epochTick[e]
	}
	return r.lastEpochTick
}

// observe sends each record of a batch to the log it belongs to (outOld
// while a cut settles and the record is stamped before it, else outCur) and
// notes what later logs must repeat. An event that only its thread's past
// explains (recorded before rotation began, see spool.NeedsPast) is written
// whole, and a thread's first records in a log are preceded by its epoch,
// so that each log reads on its own.
func (r *Rotator) observe(b []byte) error {
	r.outCur.reset()
	r.outOld.reset()
	for len(b) > 0 {
		if len(b) < spool.ChunkHdrSize || binary.LittleEndian.Uint32(b) != format.ChunkMagic {
			return fmt.Errorf("rotate: bad chunk")
		}
		nunit := int(binary.LittleEndian.Uint32(b[format.ChunkNUnitOff:]))
		tid := int32(binary.LittleEndian.Uint32(b[format.ChunkTidOff:]))
		b = b[spool.ChunkHdrSize:]
		if len(b) < nunit*spool.UnitSize {
			return fmt.Errorf("rotate: short chunk")
		}
		recs := b[:nunit*spool.UnitSize]
		b = b[nunit*spool.UnitSize:]
		if nunit == 0 {
			r.drainMark(tid)
			continue
		}
		if r.drained[tid] == ^uint64(0) {
			r.drained[tid] = 0 // a new thread with an ended one's tid
		}
		d := r.dec[tid]
		if d == nil {
			d = &spool.RecDecoder{}
			r.dec[tid] = d
		}
		// The thread's state in the maps, looked up once a chunk: whether
		// it wrote past the cut, whether each log stated its epoch, and a
		// stamp unit waiting for its record (put back if the chunk ends
		// between the two).
		split := r.old == nil || r.split[tid]
		seenCur, seenOld := r.cur.seen[tid], r.old != nil && r.old.seen[tid]
		stamp := r.stampUnit[tid]
		if stamp != nil {
			delete(r.stampUnit, tid)
		}
		var rec spool.Rec // decoded in place: a copy of it read back stalled on its stores
		for len(recs) > 0 {
			epoch := d.Epoch
			past := spool.NeedsPast(recs)
			size, ok := d.NextTo(recs, &rec)
			if !ok {
				return fmt.Errorf("rotate: event cut at a chunk's end")
			}
			ev := recs[:size]
			recs = recs[size:]
			if rec.Kind == spool.NoEvent {
				stamp = ev // it goes with the record it stamps
				continue
			}
			t := r.timeOf(&rec)
			lf, out, post, seen := r.cur, &r.outCur, r.old != nil, &seenCur
			if !split {
				if t < r.cut {
					lf, out, post, seen = r.old, &r.outOld, false, &seenOld
				} else {
					split = true
					r.split[tid] = true
				}
			}
			out.chunk(tid)
			if !*seen {
				*seen = true
				lf.seen[tid] = true
				if epoch != 0 && rec.Kind != format.REpoch {
					ep := spool.Rec{Kind: format.REpoch, TS: spool.TSEpoch | epoch}
					out.buf = spool.AppendRec(out.buf, &ep)
				}
			}
			if stamp != nil {
				out.buf = append(out.buf, stamp...)
				stamp = nil
			}
			mark := len(out.buf)
			if past {
				out.buf = spool.AppendRec(out.buf, &rec)
			} else {
				out.buf = append(out.buf, ev...)
			}
			if rec.Kind == format.REpoch {
				continue // not an event
			}
			r.Events++
			lf.events++
			if rec.Kind != format.RCalib {
				r.batchRecs++
			}
			switch rec.Kind {
			case format.RMalloc, format.RFree:
				key := spool.KeyOf(&rec)
				r.maxT = max(r.maxT, t)
				r.arrived++
				at := when{t: t, tid: tid, n: r.arrived}
				r.note(key, &rec, at, lf.seq, post)
				if !post && t < lf.start && r.late(key, at, lf.seq, &rec) {
					rec.Flags |= format.FEarlier
					out.buf = spool.AppendRec(out.buf[:mark], &rec)
				}
			case format.RCalib:
				r.noteCalib(&rec, ev)
				r.alsoToOther(out, ev)
			case format.RSite, format.RStack, format.RPyCode, format.RPySkip, format.RConfig:
				r.globals = append(r.globals, append([]byte(nil), ev...))
				r.alsoToOther(out, ev)
			}
		}
		if stamp != nil { // (a copy: the batch's buffer is the drain's, reused)
			r.stampUnit[tid] = append([]byte(nil), stamp...)
		}
	}
	r.outCur.close()
	r.outOld.close()
	return nil
}

// alsoToOther copies a record that went to one of the two logs while a cut
// settles (a calibration, a site, a stack) to the other one too: the other
// log's records may need it (the new log's prologue was written before it
// came; the old one gets the lagging threads' records).
func (r *Rotator) alsoToOther(out *logOut, ev []byte) {
	if r.old == nil {
		return
	}
	other := &r.outCur
	if out == &r.outCur {
		other = &r.outOld
	}
	other.chunk(0)
	other.buf = append(other.buf, ev...)
}

// noteCalib keeps a clock calibration for the logs to come: the newest
// epoch start, and recent ones by epoch.
func (r *Rotator) noteCalib(rec *spool.Rec, ev []byte) {
	if len(r.calibs) >= maxCalibs {
		if old, _, ok := spool.DecodeRec(r.calibs[0], 0, 0); ok && old.Flags&format.FEpoch != 0 {
			delete(r.calibAt, old.B)
		}
		r.calibs = r.calibs[1:]
	}
	c := append([]byte(nil), ev...)
	r.calibs = append(r.calibs, c)
	if rec.Flags&format.FEpoch == 0 {
		return
	}
	r.calibAt[rec.B] = c
	r.epochTick[rec.B] = rec.TS
	r.lastEpochOK = false
	delete(r.epochTick, rec.B-epochTicks)
	if rec.TS > r.calTick {
		r.calTick, r.calNs = rec.TS, rec.A
	}
}

// drainMark notes the drain's mark (libmemscope/drain.c): it took
// everything thread tid had published in the pass at hand (-tid: and the
// thread ended).
func (r *Rotator) drainMark(tid int32) {
	if tid < 0 {
		r.drained[-tid] = ^uint64(0)
	} else {
		r.drained[tid] = r.calNs
	}
}
