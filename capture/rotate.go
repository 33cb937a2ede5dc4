package capture

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

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
// starts with a spool header and the records every reader needs (allocation
// sites, Python code objects, the configuration, clock calibrations), and
// holds the blocks live when it began (MALLOCs flagged format.FInherit, in
// INHR chunks written once the cut settled, see liveset.go). Events written
// after the final drain go to the raw spool.bin, read after the logs.

// settleMaxLogs bounds how long a cut waits for late records: until the two
// logs hold that many times --log-file-mb (a program that allocates faster
// than the drain compresses keeps a backlog that long).
const settleMaxLogs = 16

// maxCalibs is how many recent calibration records a new log repeats.
const maxCalibs = 256

// epochTicks is how many recent epochs' start ticks are kept (the time of
// a record stamped with its epoch only).
const epochTicks = 4096

// logFile is an open log.
type logFile struct {
	f       *os.File
	seq     int
	start   uint64         // its cut: records stamped before it belong to earlier logs
	bytes   int64          // written so far
	pending int64          // a batch in flight: its estimated compressed size
	seen    map[int32]bool // threads whose epoch this log has stated
	events  uint64         // events first written here (Rotator.Events' share)
}

// size is the log's bytes, a batch in flight included (estimated).
func (lf *logFile) size() int64 { return lf.bytes + lf.pending }

// Rotator writes drained chunks to rotating, compressed, self-contained logs.
type Rotator struct {
	dir      string
	pid      int
	maxFiles int
	maxBytes int64
	seq      int
	cur      *logFile // the newest log
	old      *logFile // while a cut settles: the log before it, for late records
	enc      *zstd.Encoder
	// A busy batch is stored, not compressed, unless the latest frames
	// compressed (zRaw bytes to zOut, fading) to an eighth or less; busy
	// counts such batches (frame.go).
	zRaw, zOut uint64
	busy       int
	storeAll   bool   // (tests) every batch is stored
	batchRecs  int    // the records of the last batch written, its calibrations left out
	zbuf       []byte // the last frame's output, reused
	// A batch's frames are compressed and written by a goroutine while the
	// drain takes and observes the next (on 2 cores the program waits for
	// the drain either way): one batch in flight at most. Everything else
	// that compresses (a new log's prologue, inherited and AHED chunks)
	// joins it first, so one encoder serves both.
	fly   *inflight
	spare [2][]byte // the out buffers of the batch in flight, free again once it is written
	full  bool      // the disk is full and no log is left to delete: nothing more is written
	// OnWritten is called once for each Write, when the frames of its batch
	// are in their logs (a crash handler waits for that: libmemscope).
	OnWritten func()
	files     []string

	live    *liveTable // each address's latest events (liveset.go)
	cut     uint64     // the tick the newest log began at
	maxT    uint64     // the latest MALLOC's or FREE's tick so far
	cutNs   uint64
	prevCut uint64
	sweepAt int              // the live table's size that starts the next sweep (liveset.go)
	split   map[int32]bool   // threads that wrote past the cut (their records go to cur)
	drained map[int32]uint64 // by thread: when the last drain pass that took all it had published began (max: ended)
	arrived uint64           // records seen (when.n)

	globals   [][]byte          // records every log repeats
	calibs    [][]byte          // the latest clock calibration records (epoch starts)
	calibAt   map[uint64][]byte // the same by epoch
	epochTick map[uint64]uint64 // recent epochs' start ticks
	// timeOf's last look in epochTick (forgotten when an epoch is noted)
	lastEpoch, lastEpochTick uint64
	lastEpochOK              bool
	calTick                  uint64                      // the newest epoch start: tick and ns
	calNs                    uint64                      //
	dec                      map[int32]*spool.RecDecoder // each thread's past (its epoch, last site and address)
	ahead                    map[int][]byte              // AHED chunks to append to earlier logs, by log
	stampUnit                map[int32][]byte            // by thread: a stamp unit whose record is in the next batch
	outCur                   logOut
	outOld                   logOut
	// Totals for reports and tests. Late: MALLOCs and FREEs that came after
	// their log's cut had settled (liveset.go). Deleted: the events the
	// logs deleted so far held (a block of theirs still live is repeated
	// in the logs kept, as an inherited MALLOC).
	Events, RawBytes, Written, Late, Deleted uint64
	logEvents                                map[int]uint64 // by closed log kept: its events
	logBytes                                 map[int]int64  // by closed log kept: its size
}

// NewRotator starts the first log in the spool folder dir.
func NewRotator(dir string, pid, maxFiles, maxMB int) (*Rotator, error) {
	if maxFiles < 1 || maxMB < 1 {
		return nil, fmt.Errorf("rotate needs at least 1 file of at least 1 MiB")
	}
	// A 1 MiB window: a frame is one drained batch, and the default (8 MiB)
	// would hold more memory per encoder than the program may gain.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<20))
	if err != nil {
		return nil, err
	}
	r := &Rotator{dir: dir, pid: pid, maxFiles: maxFiles, maxBytes: int64(maxMB) << 20, enc: enc, sweepAt: sweepFrom,
		live: newLiveTable(), dec: map[int32]*spool.RecDecoder{},
		ahead: map[int][]byte{}, logEvents: map[int]uint64{}, logBytes: map[int]int64{}, calibAt: map[uint64][]byte{}, epochTick: map[uint64]uint64{}, drained: map[int32]uint64{}, stampUnit: map[int32][]byte{}}
	lf, err := r.open(0)
	r.cur = lf
	return r, err
}

// Moved rebases the logs' paths after their folder was renamed from old to
// dir (config(output=...), Process.Move).
func (r *Rotator) Moved(old, dir string) {
	r.dir = dir
	for i, f := range r.files {
		if rel, err := filepath.Rel(old, f); err == nil && !strings.HasPrefix(rel, "..") {
			r.files[i] = filepath.Join(dir, rel)
		}
	}
}

// Files lists the logs kept, oldest first.
func (r *Rotator) Files() []string { return append([]string(nil), r.files...) }

// open starts the next log, beginning at tick start: its header and the
// records every reader needs. Its inherited blocks come when the cut settles.
func (r *Rotator) open(start uint64) (*logFile, error) {
	// The number is taken only once the file is there: the logs kept are
	// numbered without a gap (readers refuse one as a log missing).
	p := filepath.Join(r.dir, fmt.Sprintf("%s%06d%s", spool.LogPrefix, r.seq+1, spool.LogSuffix))
	f, err := safefs.CreateNew(p, 0)
	if err != nil {
		return nil, err
	}
	r.seq++
	lf := &logFile{f: f, seq: r.seq, start: start, seen: map[int32]bool{}}
	r.files = append(r.files, p)
	for len(r.files) > r.maxFiles {
		r.dropOldest()
	}
	var pro bytes.Buffer
	_ = spool.WriteLogHeader(&pro, r.pid, lf.seq)
	var body []byte
	// Records drained late can carry an epoch that began several passes
	// ago: repeat the recent epoch starts.
	for _, c := range r.calibs {
		body = append(body, c...)
	}
	for _, g := range r.globals {
		body = append(body, g...)
	}
	if len(body) > 0 {
		pro.Write(spool.AppendChunk(nil, format.ChunkMagic, 0, body))
	}
	return lf, r.frame(lf, pro.Bytes())
}

// dropOldest deletes the oldest log kept.
func (r *Rotator) dropOldest() {
	os.Remove(r.files[0])
	r.files = r.files[1:]
	gone := r.seq - len(r.files) // its seq
	r.Deleted += r.logEvents[gone]
	delete(r.logEvents, gone)
	delete(r.logBytes, gone)
}

// trim deletes the oldest logs kept early while all of them together hold
// more than --log-files × --log-file-mb, plus 5% (never the ones being
// written): a new log grows while its cut settles, at least rotateLagNs,
// which at a program's full speed is more than a small log's size.
func (r *Rotator) trim() {
	keep := 1
	if r.old != nil {
		keep = 2
	}
	for len(r.files) > keep {
		total := r.cur.size()
		if r.old != nil {
			total += r.old.size()
		}
		for _, n := range r.logBytes {
			total += n
		}
		if total <= int64(r.maxFiles)*r.maxBytes*21/20 { // (+5%: logs end a batch past their size)
			return
		}
		r.dropOldest()
	}
}

// roomAfter handles a write that failed: on a full disk (or quota) the
// oldest log goes early, if one is kept beside the two being written, for
// the batches to come; else the logs take nothing more (the frees of later
// writes' undone bytes leave room for end.json).
func (r *Rotator) roomAfter(err error) {
	if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
		return
	}
	keep := 1
	if r.old != nil {
		keep = 2
	}
	if len(r.files) > keep {
		r.dropOldest()
		return
	}
	r.full = true
}

// errLogsFull is a batch the logs did not take: the disk is full.
var errLogsFull = errors.New("no space left for the rotated logs")

func (r *Rotator) frame(lf *logFile, raw []byte) error {
	if len(raw) == 0 {
		return nil
	}
	if r.full {
		return errLogsFull
	}
	z := r.encodeFrame(r.zbuf[:0], raw, false)
	r.zbuf = z // reused: a frame's output is garbage once written
	if err := appendFrame(lf.f, z); err != nil {
		r.roomAfter(err)
		return err
	}
	lf.bytes += int64(len(z))
	r.Written += uint64(len(z))
	return nil
}

// appendFrame appends a frame to a log. A write that fails (a full disk)
// is undone: the log ends at its last whole frame, as a reader takes it,
// and the bytes written of this one are free again (for end.json, the
// process's last words).
func appendFrame(f *os.File, z []byte) error {
	// Its size, not its offset: an earlier log is opened to append to
	// (flushAhead), where the offset is 0 until the first write.
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	off := fi.Size()
	if _, err = f.Write(z); err != nil {
		if f.Truncate(off) == nil {
			f.Seek(off, io.SeekStart)
		}
	}
	return err
}

// inflight is a batch whose frames a goroutine compresses and writes.
type inflight struct {
	done  chan struct{}
	logs  [2]*logFile
	raw   [2]int   // the raw bytes of each log's frame
	store [2]bool  // whether it is stored, not compressed
	est   [2]int64 // their size as estimated (counted in the log's pending)
	n     [2]int64 // as written
	err   error
}

// launch hands a batch's frames (bufs[i] for logs[i], either may be nil) to
// a goroutine, which calls OnWritten when they are written.
func (r *Rotator) launch(bufs [2][]byte, logs [2]*logFile) {
	f := &inflight{done: make(chan struct{}), logs: logs}
	for i, b := range bufs {
		if logs[i] == nil || len(b) == 0 {
			f.logs[i] = nil
			continue
		}
		f.raw[i] = len(b)
		if f.store[i] = r.storeBatch(logs[i], len(b)); f.store[i] {
			f.est[i] = storedSize(len(b))
		} else {
			f.est[i] = r.estimate(len(b))
		}
		logs[i].pending += f.est[i]
	}
	r.fly = f
	go func() {
		defer close(f.done)
		for i, b := range bufs {
			if f.logs[i] == nil {
				continue
			}
			z := r.encodeFrame(r.zbuf[:0], b, f.store[i])
			r.zbuf = z
			if err := appendFrame(f.logs[i].f, z); err != nil {
				f.err = err
				break
			}
			f.n[i] = int64(len(z))
		}
		r.written()
	}()
}

// estimate is the compressed size of raw bytes, at the latest frames' ratio.
func (r *Rotator) estimate(raw int) int64 {
	if r.zRaw < 1<<20 {
		return int64(raw) / 2
	}
	return int64(float64(raw) * float64(r.zOut) / float64(r.zRaw))
}

func (r *Rotator) written() {
	if r.OnWritten != nil {
		r.OnWritten()
	}
}

// join waits for the batch in flight and counts what it wrote.
func (r *Rotator) join() error {
	f := r.fly
	if f == nil {
		return nil
	}
	<-f.done
	r.fly = nil
	for i, lf := range f.logs {
		if lf == nil {
			continue
		}
		lf.pending -= f.est[i]
		lf.bytes += f.n[i]
		r.Written += uint64(f.n[i])
	}
	if f.err != nil {
		r.roomAfter(f.err)
	}
	return f.err
}

// Flush waits until every batch written is in its log.
func (r *Rotator) Flush() error { return r.join() }

// Write takes drained chunks (the spool's chunk format), notes what later
// logs must repeat, and appends them to the logs they belong to.
func (r *Rotator) Write(chunks []byte) error {
	launched := false
	defer func() {
		if !launched {
			r.written()
		}
	}()
	r.batchRecs = 0
	if r.full { // (a cut now would leave a log without even its header)
		return errLogsFull
	}
	// A cut before, not after: the new log begins after every record the
	// old one holds, and the last log never ends empty.
	if r.old == nil && r.cur.size() >= r.maxBytes && r.maxT >= r.cut {
		if err := r.join(); err != nil { // its prologue is compressed here
			return err
		}
		lf, err := r.open(r.maxT + 1)
		if err != nil {
			return err
		}
		r.old, r.cur = r.cur, lf
		r.cut, r.cutNs = lf.start, r.calNs
		r.split = map[int32]bool{}
	}
	if err := r.observe(chunks); err != nil {
		return err
	}
	r.RawBytes += uint64(len(chunks))
	jerr := r.join() // (the batch at hand goes out even if the last one failed)
	if r.full {
		return errLogsFull
	}
	bufs := [2][]byte{r.outOld.buf, r.outCur.buf}
	r.launch(bufs, [2]*logFile{r.old, r.cur})
	launched = true
	// The next batch is observed into the buffers the last one was in.
	r.outOld.buf, r.outCur.buf = r.spare[0], r.spare[1]
	r.spare = bufs
	if jerr != nil {
		return jerr
	}
	r.trim()
	r.sweep()
	if err := r.settleWhenDue(); err != nil {
		return err
	}
	return r.flushAhead()
}

// settleWhenDue settles the cut once every record stamped before it must
// have come: each thread wrote past the cut (its records come in order),
// or a drain pass that began rotateLagNs after the cut took all it had
// published (a thread preempted between stamping a record and publishing
// it has published it since).
func (r *Rotator) settleWhenDue() error {
	if r.old == nil {
		return nil
	}
	if r.old.size()+r.cur.size() >= settleMaxLogs*r.maxBytes {
		// A backlog the drain does not catch up with: the disk bound
		// comes first. What comes later is counted (Late).
		return r.settleCut()
	}
	if r.calNs < r.cutNs+rotateLagNs {
		return nil
	}
	for tid := range r.dec {
		if tid != 0 && !r.split[tid] && r.drained[tid] < r.cutNs+rotateLagNs {
			return nil
		}
	}
	return r.settleCut()
}

// settleCut ends the cut: the new log gets its inherited blocks and the old
// one is closed.
func (r *Rotator) settleCut() error {
	if err := r.join(); err != nil { // the old log's frames first
		return err
	}
	inherited := r.settle()
	err := r.frame(r.cur, inherited)
	if cerr := r.old.f.Close(); err == nil {
		err = cerr
	}
	r.closed(r.old)
	r.old = nil
	return err
}

// closed notes how many events a log that is done holds, for when it is
// deleted (at once if it was already: one log kept).
func (r *Rotator) closed(lf *logFile) {
	if r.pathOf(lf.seq) == "" {
		r.Deleted += lf.events
		return
	}
	r.logEvents[lf.seq] = lf.events
	r.logBytes[lf.seq] = lf.bytes
}

// pathOf is the path of log seq, "" once deleted.
func (r *Rotator) pathOf(seq int) string {
	if i := len(r.files) - 1 - (r.seq - seq); i >= 0 && i < len(r.files) {
		return r.files[i]
	}
	return ""
}

// addAhead queues a copy of rec, which a later log holds, for log seq: an
// AHED chunk, with the calibration of rec's epoch where rec has no precise
// stamp (the earlier log may not hold it).
func (r *Rotator) addAhead(seq int, tid int32, rec *spool.Rec) {
	if r.pathOf(seq) == "" {
		return
	}
	var c []byte
	if rec.TS&spool.TSEpoch != 0 {
		e := rec.TS &^ spool.TSEpoch
		c = append(c, r.calibAt[e]...)
		c = append(c, r.calibAt[e+1]...)
	}
	c = spool.AppendRec(c, rec)
	r.ahead[seq] = spool.AppendChunk(r.ahead[seq], format.AheadMagic, tid, c)
}

// flushAhead appends the queued AHED chunks to their logs, a frame each.
func (r *Rotator) flushAhead() error {
	if len(r.ahead) == 0 {
		return nil
	}
	if err := r.join(); err != nil {
		return err
	}
	for seq, b := range r.ahead {
		delete(r.ahead, seq)
		lf := r.cur
		if r.old != nil && r.old.seq == seq {
			lf = r.old
		} else if seq != lf.seq {
			p := r.pathOf(seq)
			if p == "" {
				continue
			}
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			earlier := &logFile{f: f}
			err = r.frame(earlier, b)
			r.logBytes[seq] += earlier.bytes
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			continue
		}
		if err := r.frame(lf, b); err != nil {
			return err
		}
	}
	return nil
}

// BatchEvents is how many records the last batch written held (the
// drain's measure of how busy the program is), its calibrations left out:
// each pass writes one, and a mark for each thread, events or not.
func (r *Rotator) BatchEvents() int { return r.batchRecs }

// Close ends the logs (a cut waiting for late records settles now: nothing
// more comes).
func (r *Rotator) Close() error {
	if r.cur == nil {
		return nil
	}
	err := r.join()
	if r.old != nil {
		if serr := r.settleCut(); err == nil {
			err = serr
		}
	}
	if ferr := r.flushAhead(); err == nil {
		err = ferr
	}
	if cerr := r.cur.f.Close(); err == nil {
		err = cerr
	}
	r.cur = nil
	return err
}

// LastLog is the number of the newest log started (log_NNNNNN.zst).
func (r *Rotator) LastLog() int { return r.seq }
