package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"sync"

	"msmemscope/format"
)

// The spool is what the traced process writes during a run (DESIGN.md,
// "Capture, then files"): a 32-byte header, then chunks. A chunk is a 16-byte
// header {magic "CHNK", nunit, tid, pid} and nunit 8-byte units of one
// thread's events, in that thread's order. An event is a full record
// {n uint32; flags, kind uint16; ts, a, b uint64} followed by n&0xffff
// payload units (C stack frames or text), or a compact MALLOC (2 units; 1
// in the short form, 3 with a stack id) or FREE (1 unit) without a stamp, told apart by the top bit of the first unit
// (see DecodeRec), or a pair unit holding two small hot events (see
// RecDecoder). A chunk with magic "PADC" is padding (nunit units to
// skip) that keeps directly written segments on 4 KiB boundaries. These
// layouts are format/records.def's.
const (
	Magic        = format.SpoolMagic
	Version      = format.SpoolVersion // versions from format.SpoolMinVersion on are read too (format/records.def)
	crcVersion   = 7                   // the first whose chunk headers hold a checksum (ChunkCRC)
	HdrSize      = format.SpoolHdrSize
	UnitSize     = format.UnitSize
	RecSize      = format.RecSize // a full record
	ChunkHdrSize = format.ChunkSize
	chunkMagic   = format.ChunkMagic // "CHNK"
	padMagic     = format.PadMagic   // "PADC": nunit units of padding (direct I/O alignment) to skip
	FileName     = "spool.bin"

	compactBit   = format.CompactBit
	compactFree  = format.CompactFree
	compactShort = format.CompactShort    // a MALLOC in 1 unit: the site of the thread's previous MALLOC
	compactOff   = format.CompactShortOff // a short MALLOC's FOff
	compactMask  = format.CompactMax

	// A pair unit (C_PAIR in format/records.def): two 29-bit halves, the
	// older in bits 32-60, the newer in bits 0-28 when bit 31 is set.
	pairBits   = format.PairBits
	pairSecond = format.PairSecond
	pairMalloc = format.PairMalloc
	pairMShift = format.PairMShift // a MALLOC half: size from here, the address delta below
)

// Record kinds and flags are format's (R_* and F_* in format/records.def).

const (
	// TSEpoch marks a record stamped with its drain epoch only (low bits);
	// the reader interpolates its time (see libmemscope/internal.h, ev_stamp).
	TSEpoch = format.TSEpoch
)

// Rec is one spool record with its payload.
type Rec struct {
	TS, A, B    uint64
	Kind, Flags uint16
	Tid         int32
	Payload     []byte // continuation records, raw
	Forced      bool   // delivered after a Park timed out (see Reader.Park)
	Site        uint32 // MALLOC: id of its allocation site (Spool.Sites), 0 unknown
}

// Frames decodes a C-stack payload.
func (r *Rec) Frames() []uint64 {
	n := len(r.Payload) / 8
	out := make([]uint64, 0, n)
	for i := 0; i < n; i++ {
		v := binary.LittleEndian.Uint64(r.Payload[i*8:])
		if v == 0 {
			break
		}
		out = append(out, v)
	}
	return out
}

// Text decodes a text payload (length in B).
func (r *Rec) Text() string {
	return string(r.Payload[:textLen(r.B, r.Payload)])
}

// textLen is a record's text length b, cut to its payload (a corrupt
// spool's b may be anything, more than an int holds included).
func textLen(b uint64, payload []byte) int {
	if b > uint64(len(payload)) {
		return len(payload)
	}
	return int(b)
}

// WriteHeader writes the header a new spool starts with.
func WriteHeader(w io.Writer, pid int) error { return WriteLogHeader(w, pid, 0) }

// WriteLogHeader is WriteHeader for rotated log number seq: a log renamed,
// or copied over another, reads as such in its capture (addLog).
func WriteLogHeader(w io.Writer, pid, seq int) error {
	var h [HdrSize]byte
	copy(h[:], Magic)
	binary.LittleEndian.PutUint32(h[8:], Version)
	binary.LittleEndian.PutUint64(h[16:], uint64(pid))
	binary.LittleEndian.PutUint64(h[logSeqOff:], uint64(seq))
	_, err := w.Write(h[:])
	return err
}

// logSeqOff is where a header holds its log's number (0: not a rotated log,
// or one written before it was kept there).
const logSeqOff = 24

// DecodeRec decodes the event at the start of b, which holds whole units.
// A compact record gets the stamp TSEpoch|epoch (its thread's current epoch),
// a short MALLOC the site of the thread's previous MALLOC, site (0: unknown).
// It returns the event, its size in bytes, and false when b ends inside it.
func DecodeRec(b []byte, epoch uint64, site uint32) (Rec, int, bool) {
	var r Rec
	size, ok := decodeRecTo(b, epoch, site, &r)
	return r, size, ok
}

// decodeRecTo is DecodeRec into *r (every field set, as Rec.set).
func decodeRecTo(b []byte, epoch uint64, site uint32, r *Rec) (int, bool) {
	if len(b) < UnitSize {
		return 0, false
	}
	w := binary.LittleEndian.Uint64(b)
	if w&compactBit != 0 {
		size := compactSize(w)
		if len(b) < size {
			return 0, false
		}
		ts, flags := TSEpoch|epoch, uint16(w>>48)&format.CompactFlags
		switch {
		case w&compactFree != 0:
			r.set(ts, w&compactMask, 0, format.RFree, flags, 0)
		case w&compactShort != 0:
			flags = format.FHost
			if w&compactOff != 0 {
				flags |= format.FOff
			}
			r.set(ts, (w&(1<<format.CompactShortShift-1))<<4, (w>>format.CompactShortShift)&(format.CompactShortSize-1), format.RMalloc, flags, site)
		default:
			w1 := binary.LittleEndian.Uint64(b[UnitSize:])
			r.set(ts, w&compactMask, w1&compactMask, format.RMalloc, flags, uint32(w1>>48))
			if size == 3*UnitSize {
				r.Payload = b[2*UnitSize : 3*UnitSize] // the stack's id
			}
		}
		return size, true
	}
	size := RecSize + UnitSize*int(w&format.RecNMask)
	if len(b) < size {
		return 0, false
	}
	r.set(binary.LittleEndian.Uint64(b[format.RecTSOff:]),
		binary.LittleEndian.Uint64(b[format.RecAOff:]),
		binary.LittleEndian.Uint64(b[format.RecBOff:]),
		binary.LittleEndian.Uint16(b[format.RecKindOff:]),
		binary.LittleEndian.Uint16(b[format.RecFlagsOff:]),
		uint32(binary.LittleEndian.Uint16(b[format.RecNOff+2:]))) // n's high half
	r.Payload = b[RecSize:size]
	return size, true
}

// RecDecoder follows one thread's records in order: a compact record means
// what it does given the thread's past — its current epoch (the stamp), the
// site of its last MALLOC (a short MALLOC's and a MALLOC half's) and the
// address of its last compact record (what a pair half's is relative to).
type RecDecoder struct {
	Epoch uint64
	Site  uint32
	Ptr   uint64
	half  bool   // the first half of the pair unit at hand was handed out
	stamp uint64 // a stamp unit's stamp for the next event (0: none)
	last  uint64 // the last stamp unit's or stamped half's stamp
}

// NoEvent is the kind of what RecDecoder.Next returns for a stamp unit.
const NoEvent = 0

// IsStamp reports whether unit w is a stamp unit (format.PairStamp).
func IsStamp(w uint64) bool { return w&pairBits == pairBits && w&format.PairStamp != 0 }

// stampOf decodes a stamp unit.
func stampOf(w uint64) uint64 { return w&(format.PairStamp-1) | (w>>32&(1<<29-1))<<30 }

// Next decodes the event at the start of b (whole units) and moves the
// decoder past it. It returns the event, the bytes it ends b's use of (0
// for the first half of a pair unit: call again for the second), and false
// when b ends inside the event.
func (d *RecDecoder) Next(b []byte) (Rec, int, bool) {
	var r Rec
	size, ok := d.NextTo(b, &r)
	return r, size, ok
}

// NextTo is Next decoding into *r, every field of which it sets (Tid to
// 0): a reader's record on the heap is filled in place, not copied whole.
func (d *RecDecoder) NextTo(b []byte, r *Rec) (int, bool) {
	if len(b) >= UnitSize {
		if w := binary.LittleEndian.Uint64(b); IsStamp(w) {
			if w&format.PairStamped == 0 {
				d.stamp = stampOf(w)
				d.last = d.stamp
				r.set(0, 0, 0, NoEvent, 0, 0)
				return UnitSize, true
			}
			d.last += w & format.PairStampDMax
			d.pairHalf(r, w>>32, d.last)
			return UnitSize, true
		} else if w&pairBits == pairBits {
			h, size := w>>32, UnitSize
			switch {
			case d.half:
				h, d.half = w, false
			case w&pairSecond != 0:
				size, d.half = 0, true
			}
			d.pairHalf(r, h, TSEpoch|d.Epoch)
			return size, true
		}
	}
	size, ok := decodeRecTo(b, d.Epoch, d.Site, r)
	if !ok {
		return size, false
	}
	if b[UnitSize-1]&0x80 != 0 {
		d.Ptr = r.A // a compact record
	}
	if r.Kind == format.RMalloc {
		d.Site = r.Site
	}
	if r.TS&TSEpoch != 0 {
		d.Epoch = r.TS &^ TSEpoch
		if d.stamp != 0 && b[UnitSize-1]&0x80 != 0 {
			r.TS = d.stamp // a compact record after a stamp unit
		}
	}
	d.stamp = 0
	return size, true
}

// set sets every field of r (those of a record without a payload).
func (r *Rec) set(ts, a, b uint64, kind, flags uint16, site uint32) {
	r.TS, r.A, r.B, r.Kind, r.Flags, r.Site = ts, a, b, kind, flags, site
	r.Tid, r.Forced = 0, false
	if r.Payload != nil {
		r.Payload = nil
	}
}

// pairHalf decodes into r the pair half in h's low 29 bits, stamped ts.
func (d *RecDecoder) pairHalf(r *Rec, h, ts uint64) {
	if h&pairMalloc != 0 {
		d.Ptr += uint64(int64(h<<47) >> 43) // 17-bit signed delta, in 16-byte steps
		r.set(ts, d.Ptr, h>>pairMShift&(format.PairMSize-1), format.RMalloc, format.FHost, d.Site)
	} else {
		d.Ptr += uint64(int64(h<<36) >> 32) // 28-bit signed delta
		r.set(ts, d.Ptr, 0, format.RFree, format.FHost, 0)
	}
}

// NeedsPast reports whether the event at the start of b means something
// only after its thread's earlier records (a short MALLOC, a pair unit): a
// reader starting in the middle of a thread cannot decode it.
func NeedsPast(b []byte) bool {
	if len(b) < UnitSize {
		return false
	}
	w := binary.LittleEndian.Uint64(b)
	return w&pairBits == pairBits && (!IsStamp(w) || w&format.PairStamped != 0) ||
		w&(compactBit|compactFree|compactShort) == compactBit|compactShort
}

// compactSize is the size in bytes of the compact record whose first unit
// is w: a FREE, short MALLOC or pair 1 unit, a MALLOC 2, with a stack id 3.
func compactSize(w uint64) int {
	switch {
	case w&(compactFree|compactShort) != 0:
		return UnitSize
	case uint16(w>>48)&format.FStackID != 0:
		return 3 * UnitSize
	}
	return 2 * UnitSize
}

// AppendRec appends r as a full record (its payload padded to whole units).
func AppendRec(dst []byte, r *Rec) []byte {
	n := (len(r.Payload) + UnitSize - 1) / UnitSize
	var h [RecSize]byte
	binary.LittleEndian.PutUint32(h[format.RecNOff:], uint32(n)|(r.Site&format.RecNMask)<<16)
	binary.LittleEndian.PutUint16(h[format.RecFlagsOff:], r.Flags)
	binary.LittleEndian.PutUint16(h[format.RecKindOff:], r.Kind)
	binary.LittleEndian.PutUint64(h[format.RecTSOff:], r.TS)
	binary.LittleEndian.PutUint64(h[format.RecAOff:], r.A)
	binary.LittleEndian.PutUint64(h[format.RecBOff:], r.B)
	dst = append(dst, h[:]...)
	dst = append(dst, r.Payload...)
	for i := len(r.Payload); i < n*UnitSize; i++ {
		dst = append(dst, 0)
	}
	return dst
}

// EpochEndOf reads an epoch's start (R_CALIB with F_EPOCH) for the end of
// the epoch before it: the drain's stamp once it had moved the gate, the
// record's payload where the spool has one (drain.c, epoch_start).
func EpochEndOf(r *Rec) (epoch, tick uint64, ok bool) {
	if len(r.Payload) < UnitSize || r.B == 0 {
		return 0, 0, false
	}
	return r.B - 1, binary.LittleEndian.Uint64(r.Payload), true
}

// AppendChunk appends a chunk of thread tid holding body (whole units) as
// the drain frames one: its header, then body.
func AppendChunk(dst []byte, magic uint32, tid int32, body []byte) []byte {
	var h [ChunkHdrSize]byte
	binary.LittleEndian.PutUint32(h[format.ChunkMagicOff:], magic)
	binary.LittleEndian.PutUint32(h[format.ChunkNUnitOff:], uint32(len(body)/UnitSize))
	binary.LittleEndian.PutUint32(h[format.ChunkTidOff:], uint32(tid))
	binary.LittleEndian.PutUint32(h[format.ChunkCRCOff:], ChunkCRC(tid, body))
	return append(append(dst, h[:]...), body...)
}

// castagnoli is CRC-32C's table (SSE 4.2's crc32 instruction where the CPU
// has it, as the drain's).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ChunkCRC is the checksum a chunk's header holds (spool version 7 on):
// CRC-32C of its thread id (4 bytes, little-endian) and its units; 0 for a
// chunk of none. A reader tells a chunk damaged on disk from a whole one.
func ChunkCRC(tid int32, units []byte) uint32 {
	if len(units) == 0 {
		return 0
	}
	var t [4]byte
	binary.LittleEndian.PutUint32(t[:], uint32(tid))
	return crc32.Update(crc32.Checksum(t[:], castagnoli), castagnoli, units)
}

type chunkRef struct {
	off     int64 // of the first unit
	nunit   uint32
	repeats bool // in a later rotated log: its inherited blocks are known already
}

// aheadChunk is a rotated log's chunk read as a stream of its own, out of
// its thread's order: its inherited blocks (INHR, written once its cut
// settled), or, read alone, copies of records a later log holds (AHED).
type aheadChunk struct {
	tid int32
	ref chunkRef
}

// calibPoint pairs a raw tick with CLOCK_MONOTONIC ns.
type calibPoint struct{ tick, ns uint64 }

// Spool is an indexed spool file, ready to be read in time order.
type Spool struct {
	f                 io.ReaderAt
	closer            io.Closer
	repeats           [][2]int64   // where later rotated logs lie, [start, end) in order (NewLogs)
	ahead             []aheadChunk // INHR and AHED chunks: streams of their own
	size              int64
	Pid               int
	threads           map[int32][]chunkRef
	calib             []calibPoint
	epochNs           map[uint64]uint64 // epoch -> CLOCK_MONOTONIC ns at its start
	epochEndNs        map[uint64]uint64 // epoch -> ns by which it had ended (the next one's gate set), where recorded (ticks while indexing)
	preciseOn         []uint64          // when precise stamps began (R_PRECISE), in ns
	Sites             map[uint32]uint64 // site id -> return address of the allocator's caller
	stacks            map[uint32][]byte // stack id -> an RStack's payload (its frames)
	firstNs           uint64            // the earliest record that is not inherited (0: unknown)
	minTick, minEpoch uint64
	slope             float64   // ns per tick outside the calibrated span
	rates             []float64 // ns per tick from calib[i-1] to calib[i]
	Records           uint64    // events (not continuation records)
	HasStep           bool      // the process called step()
	HasTorch          bool      // operator launches or tensor owner tags (format.ROpStart..RTag)
	Bytes             int64
	PadBytes          int64    // padding chunks (direct writes keep 4 KiB alignment)
	Truncated         bool     // the file ended inside a chunk (a killed run)
	CutLogs           []string // rotated logs read up to a frame cut short or damaged: "path: why"
	Py                PyMeta   // Python code objects, msmemscope's own folders, configuration (pycode.go)

	histOnce sync.Once
	hist     *cudaHistory // PyTorch's CUDA allocator history (cudahist.go)
}

// OpenFile reads the whole spool once to index chunks per thread and collect
// the clock calibration; events are then read back with Reader.
func OpenFile(path string) (*Spool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	s, err := New(f, fi.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	s.closer = f
	return s, nil
}

// New indexes a spool held in memory or elsewhere (a decompressed
// rotated log, say).
func New(ra io.ReaderAt, size int64) (*Spool, error) { return newSpool(ra, size, nil) }

// NewLogs indexes rotated logs read one after the other as one spool (each
// after the first without its header): laterLogs are where each log after
// the first lies, [start, end). The blocks such a log inherits are
// live already in the logs before it, so the reader leaves those records
// out: dated at the start of the whole stream, they would come before the
// FREEs the earlier logs hold and invent blocks.
func NewLogs(ra io.ReaderAt, size int64, laterLogs [][2]int64) (*Spool, error) {
	return newSpool(ra, size, laterLogs)
}

// repeated reports whether the chunk at off is in a later rotated log, whose
// inherited blocks the logs before it hold.
func (s *Spool) repeated(off int64) bool {
	i := sort.Search(len(s.repeats), func(i int) bool { return s.repeats[i][1] > off })
	return i < len(s.repeats) && s.repeats[i][0] <= off
}

func newSpool(ra io.ReaderAt, size int64, repeats [][2]int64) (*Spool, error) {
	s := &Spool{f: ra, size: size, threads: map[int32][]chunkRef{}, epochNs: map[uint64]uint64{}, epochEndNs: map[uint64]uint64{}, Sites: map[uint32]uint64{}, stacks: map[uint32][]byte{}, repeats: repeats}
	if err := s.index(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Spool) Close() error {
	if s.closer == nil {
		return nil
	}
	return s.closer.Close()
}

func (s *Spool) index() error {
	size := s.size
	s.Bytes = size
	var hdr [HdrSize]byte
	if _, err := s.f.ReadAt(hdr[:], 0); err != nil || string(hdr[:8]) != Magic {
		return errors.New("not an msmemscope spool (bad header)")
	}
	v := binary.LittleEndian.Uint32(hdr[8:])
	if v < format.SpoolMinVersion || v > Version {
		return fmt.Errorf("spool format version %d, this msmemscope reads version %d", v, Version)
	}
	checked := v >= crcVersion
	s.Pid = int(binary.LittleEndian.Uint64(hdr[16:]))
	var buf []byte
	off := int64(HdrSize)
	var ch [ChunkHdrSize]byte
	for off+ChunkHdrSize <= size {
		if _, err := s.f.ReadAt(ch[:], off); err != nil {
			return err
		}
		want := binary.LittleEndian.Uint32(ch[format.ChunkNUnitOff:])
		magic := binary.LittleEndian.Uint32(ch[format.ChunkMagicOff:])
		// Skipped: padding, and with logs read together the copies of records
		// a later log holds (read with it, they are there).
		if magic == padMagic || magic == format.AheadMagic && len(s.repeats) > 0 {
			if magic == padMagic {
				s.PadBytes += ChunkHdrSize + int64(want)*UnitSize
			}
			if off += ChunkHdrSize + int64(want)*UnitSize; off > size {
				s.Truncated = true // killed while it was written
			}
			continue
		} else if magic != chunkMagic && magic != format.AheadMagic && magic != format.InheritMagic {
			return fmt.Errorf("corrupt chunk header at byte %d", off)
		}
		ownStream := magic != chunkMagic
		tid := int32(binary.LittleEndian.Uint32(ch[format.ChunkTidOff:]))
		data := off + ChunkHdrSize
		nunit := want
		if avail := (size - data) / UnitSize; int64(nunit) > avail {
			nunit = uint32(avail) // the run was killed while this chunk was written
			s.Truncated = true
		}
		n := int(nunit) * UnitSize
		if cap(buf) < n {
			buf = make([]byte, n)
		}
		buf = buf[:n]
		if _, err := s.f.ReadAt(buf, data); err != nil {
			return err
		}
		// A chunk written whole whose units do not match its checksum was
		// damaged on disk: its records would be read as other events.
		if checked && nunit == want && ChunkCRC(tid, buf) != binary.LittleEndian.Uint32(ch[format.ChunkCRCOff:]) {
			return fmt.Errorf("damaged chunk at byte %d (its %d units do not match their checksum)", off, nunit)
		}
		// Whole events only: calibrations and steps are noted on the way.
		whole := 0
		for whole < n {
			// Compact records (the bulk) carry nothing the index needs.
			if w := binary.LittleEndian.Uint64(buf[whole:]); w&compactBit != 0 {
				if size := compactSize(w); whole+size <= n {
					whole += size
				} else {
					s.Truncated = true
					break
				}
				if IsStamp(w) && w&format.PairStamped == 0 {
					continue // not an event
				}
				s.Records++
				if w&pairBits == pairBits && w&pairSecond != 0 && !IsStamp(w) {
					s.Records++
				}
				continue
			}
			r, size, ok := DecodeRec(buf[whole:], 0, 0)
			if !ok {
				s.Truncated = true
				break
			}
			whole += size
			if !(r.Kind == format.RMalloc && r.Flags&format.FInherit != 0) && r.Kind != format.RCalib {
				if r.TS&TSEpoch != 0 {
					if e := r.TS &^ TSEpoch; s.minEpoch == 0 || e < s.minEpoch {
						s.minEpoch = e
					}
				} else if r.TS != 0 && (s.minTick == 0 || r.TS < s.minTick) {
					s.minTick = r.TS
				}
			}
			switch r.Kind {
			case format.REpoch:
				continue // not an event
			case format.RCalib:
				s.calib = append(s.calib, calibPoint{r.TS, r.A})
				if r.Flags&format.FEpoch != 0 {
					s.epochNs[r.B] = r.A
					if e, tick, ok := EpochEndOf(&r); ok {
						s.epochEndNs[e] = tick
					}
				}
			case format.RPrecise:
				s.preciseOn = append(s.preciseOn, r.TS)
			case format.RStep:
				s.HasStep = true
			case format.ROpStart, format.RTag:
				s.HasTorch = true
			case format.RSite:
				s.Sites[uint32(r.B)] = r.A
			case format.RStack:
				s.stacks[uint32(r.A)] = append([]byte(nil), r.Payload...)
			case format.RPyCode, format.RPySkip, format.RConfig:
				s.Py.note(r.Kind, r.TS, r.A, r.B, r.Payload)
			}
			s.Records++
		}
		if ref := (chunkRef{data, uint32(whole / UnitSize), s.repeated(off)}); whole > 0 && ownStream {
			s.ahead = append(s.ahead, aheadChunk{tid, ref})
		} else if whole > 0 {
			s.threads[tid] = append(s.threads[tid], ref)
		}
		off = data + int64(nunit)*UnitSize
		if nunit < want {
			break
		}
	}
	if off < size && off+ChunkHdrSize > size {
		s.Truncated = true
	}
	sort.Slice(s.calib, func(i, j int) bool { return s.calib[i].tick < s.calib[j].tick })
	s.slope = 1
	if n := len(s.calib); n >= 2 && s.calib[n-1].tick > s.calib[0].tick {
		s.slope = float64(s.calib[n-1].ns-s.calib[0].ns) / float64(s.calib[n-1].tick-s.calib[0].tick)
	}
	// Each interval's ns per tick, divided once (every precise stamp is
	// converted: a division each showed).
	s.rates = make([]float64, len(s.calib))
	for i := 1; i < len(s.calib); i++ {
		if a, b := s.calib[i-1], s.calib[i]; b.tick > a.tick {
			s.rates[i] = float64(b.ns-a.ns) / float64(b.tick-a.tick)
		}
	}
	if s.minTick != 0 {
		s.firstNs = s.Ns(s.minTick)
	}
	for e, t := range s.epochEndNs {
		s.epochEndNs[e] = s.Ns(t)
	}
	for i, t := range s.preciseOn {
		s.preciseOn[i] = s.Ns(t)
	}
	slices.Sort(s.preciseOn)
	if ns, ok := s.epochNs[s.minEpoch]; ok && (s.firstNs == 0 || ns < s.firstNs) {
		s.firstNs = ns
	}
	return nil
}

// Ns converts a raw stamp to CLOCK_MONOTONIC nanoseconds, interpolating
// between calibration points.
func (s *Spool) Ns(tick uint64) uint64 {
	var hint int
	return s.nsNear(tick, &hint)
}

// nsNear is Ns starting from *hint, the calibration interval of the
// caller's last tick (a thread's ticks grow: mostly the same one), which
// it updates.
func (s *Spool) nsNear(tick uint64, hint *int) uint64 {
	c := s.calib
	if len(c) == 0 {
		return tick
	}
	i := *hint // the first calibration after tick
	if i > len(c) || i > 0 && c[i-1].tick > tick || i < len(c) && c[i].tick <= tick {
		i = sort.Search(len(c), func(i int) bool { return c[i].tick > tick })
		*hint = i
	}
	switch {
	case i == 0:
		return uint64(float64(c[0].ns) - float64(c[0].tick-tick)*s.slope)
	case i == len(c):
		a := c[len(c)-1]
		return a.ns + uint64(float64(tick-a.tick)*s.slope)
	}
	a := c[i-1]
	return a.ns + uint64(float64(tick-a.tick)*s.rates[i]) // (0 where a and c[i] share a tick)
}

// Threads returns the thread ids that recorded events.
func (s *Spool) Threads() int { return len(s.threads) }

// epochEnd is when an epoch ended: when the drain had set the next one
// (recorded since the drain stamps it), else when the next one began; false
// if unknown.
func (s *Spool) epochEnd(e uint64) (uint64, bool) {
	if ns, ok := s.epochEndNs[e]; ok {
		return ns, true
	}
	ns, ok := s.epochNs[e+1]
	return ns, ok
}

// threadCursor walks one thread's records across its chunks, giving each a
// time: precise stamps are converted, epoch-only stamps interpolated between
// the precise ones around them, never past the end of their epoch.
type threadCursor struct {
	tid    int32
	chunks []chunkRef
	buf    []byte
	pos    int        // byte offset in buf
	dec    RecDecoder // the thread's past, which its compact records need
	stacks map[uint32][]byte
	seq    uint64
	idx    int  // its place among the reader's cursors (Less2's last key)
	cur    *Rec // in q
	ns     uint64
	q      []Rec // records read ahead up to the next precise stamp
	qns    []uint64
	qi     int
	prevNs uint64  // time of the last record handed out
	floor  uint64  // no record of this thread is earlier (ordering repair)
	repeat bool    // the chunk at hand is in a later rotated log (chunkRef.repeats)
	early  *uint64 // counts records left out as paired in an earlier log (Reader.Earlier)

	// Bounds on when the current record truly happened (its hook's
	// stamp): between the thread's precise stamps around it, within its
	// epoch. The merge orders by the estimate ns; the bounds say when
	// another thread's record cannot come before it (order.go).
	lo, hi      uint64
	qlo, qhi    uint64 // the bounds of the queued epoch-only records
	lastPrecise uint64 // the thread's last precise stamp, in ns
	calibAt     int    // the calibration interval of its last precise stamp (Spool.nsNear)

	parkKey BlockKey // the address it is held back on, while in Reader.parked (order.go)
}

// raw reads the next record of the thread into rec; its payload stays
// valid because every chunk gets a fresh buffer. (Records are filled in
// place: a Rec is 64 bytes, and copying it out of each layer showed.)
func (c *threadCursor) raw(f io.ReaderAt, rec *Rec) (bool, error) {
	for {
		ok, err := c.next(f, rec)
		if !ok || err != nil {
			return ok, err
		}
		if c.repeat && rec.Kind == format.RMalloc && rec.Flags&format.FInherit != 0 {
			continue // live already in the logs before this one
		}
		if !c.repeat && rec.Flags&format.FEarlier != 0 && (rec.Kind == format.RMalloc || rec.Kind == format.RFree) {
			*c.early++ // its partner is in an earlier log, not read
			continue
		}
		return true, nil
	}
}

// next is raw without leaving out a later log's inherited blocks.
func (c *threadCursor) next(f io.ReaderAt, rec *Rec) (bool, error) {
	for {
		for c.pos >= len(c.buf) {
			if len(c.chunks) == 0 {
				return false, nil
			}
			ch := c.chunks[0]
			c.chunks = c.chunks[1:]
			c.buf = make([]byte, int(ch.nunit)*UnitSize)
			if _, err := f.ReadAt(c.buf, ch.off); err != nil {
				return false, err
			}
			c.pos, c.repeat = 0, ch.repeats
		}
		var size int
		var ok bool
		size, ok = c.dec.NextTo(c.buf[c.pos:], rec) // the index kept whole events only
		if !ok {
			c.pos = len(c.buf) // cannot happen for an indexed chunk; never loop on it
			continue
		}
		c.pos += size
		if rec.Kind == format.REpoch || rec.Kind == format.RStack || rec.Kind == NoEvent {
			continue // not events
		}
		rec.Tid = c.tid
		if rec.Flags&(format.FCStack|format.FStackID) == format.FCStack|format.FStackID && len(rec.Payload) >= UnitSize {
			// (a MALLOC's, or an OOM's: any record with a C stack)
			// The stack named by id, as if it had come whole (none if unknown: a killed run).
			rec.Payload = c.stacks[uint32(binary.LittleEndian.Uint64(rec.Payload))]
			if rec.Flags &^= format.FStackID; len(rec.Payload) == 0 {
				rec.Flags &^= format.FCStack
			}
		}
		return true, nil
	}
}

const maxLookahead = 1 << 16

func (c *threadCursor) load(s *Spool) (bool, error) {
	if c.qi >= len(c.q) {
		c.q, c.qns, c.qi = c.q[:0], c.qns[:0], 0
		for len(c.q) < maxLookahead {
			if len(c.q) < cap(c.q) {
				c.q = c.q[:len(c.q)+1] // raw sets every field
			} else {
				c.q = append(c.q, Rec{})
			}
			r := &c.q[len(c.q)-1]
			ok, err := c.raw(s.f, r)
			if err != nil {
				return false, err
			}
			if !ok {
				c.q = c.q[:len(c.q)-1]
				break
			}
			if r.TS&TSEpoch == 0 {
				break
			}
		}
		if len(c.q) == 0 {
			return false, nil
		}
		c.times(s)
	}
	c.cur, c.ns = &c.q[c.qi], c.qns[c.qi]
	c.qi++
	if c.cur.TS&TSEpoch != 0 {
		c.lo, c.hi = c.qlo, c.qhi
	} else {
		c.lo, c.hi = c.ns-min(c.ns, stampJitter), c.ns+stampJitter
	}
	if c.cur.Kind == format.RMalloc && c.cur.Flags&format.FInherit != 0 && s.firstNs > 0 {
		c.ns = s.firstNs - 1 // live before anything in this log happened
		c.lo, c.hi = c.ns, c.ns
	}
	if c.ns < c.floor {
		c.ns = c.floor
	}
	// A thread's records are in program order, but their stamps need not be
	// (an R_SITE stamped after the MALLOC that follows it): never go back in
	// time within a thread, so the merged stream stays ordered (SPEC §2.1).
	if c.cur.Kind == format.RCalib {
		return true, nil // not an event: its time stays its own
	}
	if c.ns < c.prevNs {
		c.ns = c.prevNs
	}
	c.prevNs = c.ns
	return true, nil
}

// times assigns times to the queued records: m epoch-only records, then
// possibly one precisely stamped record.
func (c *threadCursor) times(s *Spool) {
	n := len(c.q)
	c.qns = c.qns[:0]
	last := c.q[n-1]
	m := n
	var q uint64
	hasQ := last.TS&TSEpoch == 0
	if hasQ {
		m = n - 1
		q = s.nsNear(last.TS, &c.calibAt)
	}
	if m > 0 {
		c.bounds(s, c.q[0].TS&^TSEpoch, hasQ, q)
	}
	if hasQ {
		c.lastPrecise = max(c.lastPrecise, q)
	}
	if m > 0 {
		e := c.q[0].TS &^ TSEpoch
		lo := c.prevNs
		if st, ok := s.epochNs[e]; ok && st > lo {
			lo = st
		}
		if lo == 0 && hasQ {
			lo = q // the epoch's start is unknown (not in this file): no earlier than needed
		}
		hi, ok := s.epochEnd(e)
		if hasQ && (!ok || q < hi) {
			hi, ok = q, true
		}
		if c.qhi < hi || !ok && c.qhi != math.MaxUint64 {
			hi, ok = c.qhi, true // precise stamps began before that (bounds)
		}
		if !ok || hi < lo {
			hi = lo + uint64(m) + 1 // unknown end: keep order, 1 ns apart
		}
		for i := 1; i <= m; i++ {
			c.qns = append(c.qns, lo+(hi-lo)*uint64(i)/uint64(m+1))
		}
	}
	if hasQ {
		if m > 0 && q < c.qns[m-1] {
			q = c.qns[m-1]
		}
		c.qns = append(c.qns, q)
	}
}

// epochSlack covers an epoch's end where the spool has only the next
// epoch's calibration, taken just before the gate moves on (drain.c,
// epoch_start: older spools, where a record of the old epoch may come a
// moment after it), and the conversion of ticks to ns.
const epochSlack = 100_000

// stampJitter is how far a precise stamp may lie from its event: the hot
// path reads the TSC unfenced, so the read may move by what the core has in
// flight (a few hundred cycles).
const stampJitter = 1_000

// bounds sets qlo and qhi for epoch-only records of epoch e: no earlier than
// the thread's last precise stamp or the epoch's start, no later than the
// precise stamp q that follows them (when hasQ) or the epoch's end.
func (c *threadCursor) bounds(s *Spool, e uint64, hasQ bool, q uint64) {
	c.qlo, c.qhi = c.lastPrecise-min(c.lastPrecise, stampJitter), math.MaxUint64
	if st, ok := s.epochNs[e]; ok && st > c.qlo {
		c.qlo = st
	}
	if end, ok := s.epochEnd(e); ok {
		c.qhi = end + epochSlack
	}
	if hasQ && q+stampJitter < c.qhi {
		c.qhi = q + stampJitter
	}
	// Written while precise stamps were off (the thread's first event after
	// they stop is stamped, so qlo is after that): before they next began.
	on := s.preciseOn
	if i, _ := slices.BinarySearch(on, c.qlo); i < len(on) && on[i]+stampJitter < c.qhi {
		c.qhi = on[i] + stampJitter
	}
	if c.qhi < c.qlo {
		c.qhi = c.qlo
	}
}
