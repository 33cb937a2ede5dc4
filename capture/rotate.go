package capture

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/klauspost/compress/zstd"

	"msmemscope/format"
	"msmemscope/internal/safefs"
	"msmemscope/spool"
)

// Rotating logs (--log-mode=rotate, SPEC §7): bounded disk for long runs.
// The engine drains the rings into memory and hands the chunks to a Rotator,
// which appends them to spool/log_NNNNNN.zst as independent zstd frames (a
// killed run leaves whole frames) and starts a new file past --log-file-mb,
// deleting the oldest beyond --log-files. Each file is self-contained: it
// starts with a spool header, the records every reader needs (allocation
// sites, Python code objects, the configuration, a clock calibration) and the
// blocks live at that moment (MALLOCs flagged format.FInherit). Events written
// after the final drain go to the raw spool.bin, read after the logs.

// maxCalibs is how many recent calibration records a new log repeats.
const maxCalibs = 256

// liveBlock is a live address: its latest MALLOC record (and payload), and
// how many MALLOCs of it are not freed yet. Chunks of a batch come thread by
// thread, not in time order: a FREE by one thread can be seen after another
// thread's MALLOC of the same (reused) address, so counts, not presence,
// decide what is live.
type liveBlock struct {
	rec []byte // a full record, whatever form the MALLOC had
	tid int32  // the thread that made it
	n   int
}

// Rotator writes drained chunks to rotating, compressed, self-contained logs.
type Rotator struct {
	dir      string
	pid      int
	maxFiles int
	maxBytes int64
	seq      int
	cur      *os.File
	curBytes int64
	enc      *zstd.Encoder
	live     map[spool.BlockKey]*liveBlock
	globals  [][]byte                    // records every log repeats
	calibs   [][]byte                    // the latest clock calibration records (epoch starts)
	dec      map[int32]*spool.RecDecoder // each thread's past (its epoch, last site and address)
	out      []byte                      // the batch as the log gets it
	files    []string
	last     int
	// Totals for reports and tests.
	Events, RawBytes, Written uint64
}

// NewRotator starts the first log in the spool folder dir.
func NewRotator(dir string, pid, maxFiles, maxMB int) (*Rotator, error) {
	if maxFiles < 1 || maxMB < 1 {
		return nil, fmt.Errorf("rotate needs at least 1 file of at least 1 MiB")
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	r := &Rotator{dir: dir, pid: pid, maxFiles: maxFiles, maxBytes: int64(maxMB) << 20, enc: enc,
		live: map[spool.BlockKey]*liveBlock{}, dec: map[int32]*spool.RecDecoder{}}
	return r, r.open()
}

// Files lists the logs kept, oldest first.
func (r *Rotator) Files() []string { return append([]string(nil), r.files...) }

// open starts the next log.
func (r *Rotator) open() error {
	r.seq++
	p := filepath.Join(r.dir, fmt.Sprintf("%s%06d%s", spool.LogPrefix, r.seq, spool.LogSuffix))
	f, err := safefs.CreateNew(p, 0)
	if err != nil {
		return err
	}
	r.cur, r.curBytes = f, 0
	r.files = append(r.files, p)
	for len(r.files) > r.maxFiles {
		os.Remove(r.files[0])
		r.files = r.files[1:]
	}
	// The prologue: header, then one chunk of the records a reader needs.
	var pro bytes.Buffer
	_ = spool.WriteHeader(&pro, r.pid)
	var body bytes.Buffer
	n := 0
	add := func(rec []byte) {
		body.Write(rec)
		n += len(rec) / spool.UnitSize
	}
	// Inherited blocks first: they are dated before everything else.
	keys := make([]spool.BlockKey, 0, len(r.live))
	for k := range r.live {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].Ptr < keys[j].Ptr })
	// Inherited blocks sort before everything in the log (a lagging thread's
	// records can be older than the rotation); readers date them just before
	// the log's earliest record.
	// Each thread's in a chunk of its own (below): the rows name the thread
	// that allocated the block.
	const tick = 1
	inherited := map[int32][]byte{}
	for _, k := range keys {
		b := r.live[k]
		rec, _, _ := spool.DecodeRec(b.rec, 0, 0) // a full record
		rec.TS = tick                             // live when this log began
		rec.Flags |= format.FInherit
		inherited[b.tid] = spool.AppendRec(inherited[b.tid], &rec)
	}
	// Records drained late (a lagging drain) can carry an epoch that began
	// several passes ago: repeat the recent epoch starts.
	for _, c := range r.calibs {
		add(c)
	}
	for _, g := range r.globals {
		add(g)
	}
	if n > 0 {
		writeChunkHeader(&pro, uint32(n), 0, r.pid)
		pro.Write(body.Bytes())
	}
	// A thread's records drained next may continue an epoch it entered in
	// an earlier log: restate each thread's epoch in a chunk of its own.
	// Each thread's inherited blocks come before its records in this log.
	tids := make([]int32, 0, len(r.dec))
	for tid, d := range r.dec {
		if d.Epoch != 0 || inherited[tid] != nil {
			tids = append(tids, tid)
		}
	}
	for tid := range inherited {
		if r.dec[tid] == nil {
			tids = append(tids, tid)
		}
	}
	sort.Slice(tids, func(i, j int) bool { return tids[i] < tids[j] })
	for _, tid := range tids {
		c := inherited[tid]
		if d := r.dec[tid]; d != nil && d.Epoch != 0 {
			ep := spool.Rec{Kind: format.REpoch, TS: spool.TSEpoch | d.Epoch}
			c = spool.AppendRec(c, &ep)
		}
		writeChunkHeader(&pro, uint32(len(c)/spool.UnitSize), tid, r.pid)
		pro.Write(c)
	}
	return r.frame(pro.Bytes())
}

func writeChunkHeader(w *bytes.Buffer, nrec uint32, tid int32, pid int) {
	var h [spool.ChunkHdrSize]byte
	binary.LittleEndian.PutUint32(h[format.ChunkMagicOff:], format.ChunkMagic)
	binary.LittleEndian.PutUint32(h[format.ChunkNUnitOff:], nrec)
	binary.LittleEndian.PutUint32(h[format.ChunkTidOff:], uint32(tid))
	binary.LittleEndian.PutUint32(h[format.ChunkPidOff:], uint32(pid))
	w.Write(h[:])
}

func (r *Rotator) frame(raw []byte) error {
	z := r.enc.EncodeAll(raw, nil)
	if _, err := r.cur.Write(z); err != nil {
		return err
	}
	r.curBytes += int64(len(z))
	r.Written += uint64(len(z))
	return nil
}

// Write takes drained chunks (the spool's chunk format), notes what later
// logs must repeat, and appends them to the current log.
func (r *Rotator) Write(chunks []byte) error {
	// Rotate before, not after: the new log's prologue is the state these
	// chunks start from, and the last log never ends empty.
	if r.curBytes >= r.maxBytes {
		if err := r.cur.Close(); err != nil {
			return err
		}
		if err := r.open(); err != nil {
			return err
		}
	}
	out, err := r.observe(chunks)
	if err != nil {
		return err
	}
	r.RawBytes += uint64(len(chunks))
	r.last = len(chunks)
	return r.frame(out)
}

// LastBytes is the size of the last batch written (the drain's idleness).
func (r *Rotator) LastBytes() int { return r.last }

// observe notes what later logs must repeat and returns the batch as the
// log gets it: an event that only its thread's past explains (recorded
// before rotation began, see spool.NeedsPast) is written whole, so that
// each log reads on its own.
func (r *Rotator) observe(b []byte) ([]byte, error) {
	out := r.out[:0]
	for len(b) > 0 {
		if len(b) < spool.ChunkHdrSize || binary.LittleEndian.Uint32(b) != format.ChunkMagic {
			return nil, fmt.Errorf("rotate: bad chunk")
		}
		nunit := int(binary.LittleEndian.Uint32(b[format.ChunkNUnitOff:]))
		tid := int32(binary.LittleEndian.Uint32(b[format.ChunkTidOff:]))
		start := len(out)
		out = append(out, b[:spool.ChunkHdrSize]...)
		b = b[spool.ChunkHdrSize:]
		if len(b) < nunit*spool.UnitSize {
			return nil, fmt.Errorf("rotate: short chunk")
		}
		recs := b[:nunit*spool.UnitSize]
		b = b[nunit*spool.UnitSize:]
		d := r.dec[tid]
		if d == nil {
			d = &spool.RecDecoder{}
			r.dec[tid] = d
		}
		for len(recs) > 0 {
			past := spool.NeedsPast(recs)
			rec, size, ok := d.Next(recs)
			if !ok {
				return nil, fmt.Errorf("rotate: event cut at a chunk's end")
			}
			ev := recs[:size]
			recs = recs[size:]
			if past {
				out = spool.AppendRec(out, &rec)
			} else {
				out = append(out, ev...)
			}
			if rec.Kind == format.REpoch || rec.Kind == spool.NoEvent {
				continue // not an event
			}
			r.Events++
			key := spool.BlockKey{Sub: rec.Flags & format.FSubMask, Ptr: rec.A}
			switch rec.Kind {
			case format.RMalloc:
				if rec.Flags&format.FUndo == 0 {
					b := r.live[key]
					if b == nil {
						b = &liveBlock{}
						r.live[key] = b
					}
					b.n++
					b.rec, b.tid = spool.AppendRec(b.rec[:0], &rec), tid
				}
			case format.RFree:
				if b := r.live[key]; b != nil {
					if b.n--; b.n <= 0 {
						delete(r.live, key)
					}
				}
			case format.RCalib:
				if len(r.calibs) >= maxCalibs {
					r.calibs = r.calibs[1:]
				}
				r.calibs = append(r.calibs, append([]byte(nil), ev...))
			case format.RSite, format.RStack, format.RPyCode, format.RPySkip, format.RConfig:
				r.globals = append(r.globals, append([]byte(nil), ev...))
			}
		}
		binary.LittleEndian.PutUint32(out[start+4:], uint32((len(out)-start-spool.ChunkHdrSize)/spool.UnitSize))
	}
	r.out = out
	return out, nil
}

// Close ends the current log.
func (r *Rotator) Close() error {
	if r.cur == nil {
		return nil
	}
	err := r.cur.Close()
	r.cur = nil
	return err
}
