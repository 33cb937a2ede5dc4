package leakscan

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"
	"sync/atomic"

	"msmemscope/format"
	"msmemscope/internal/u64map"
	"msmemscope/spool"
)

// addrLife is what one pass over a spool knows of an address.
type addrLife struct {
	mallocs, frees uint32
	lastM          uint64 // the time of its latest MALLOC
	size           uint64 // that MALLOC's size
}

// Live is the set of HOST blocks live in a spool file, kept up to date as
// the file grows: each Update reads only the whole chunks appended since
// the last one. It reads each thread's records in order, without merging
// the threads by time: the allocator alternates MALLOCs and FREEs on an
// address, so their counts say whether it is live, whatever the order
// across threads (stamps only pick the latest MALLOC, whose size the block
// has). A block allocated before the capture and freed in it would count a
// FREE too many: the scan runs only where the capture began at the first
// allocation (the library preloaded or linked).
type Live struct {
	f         *os.File
	off       int64                // where the next chunk's header is
	lives     u64map.Map[addrLife] // by address
	decs      map[int32]*spool.RecDecoder
	epochTick map[uint64]uint64
	lastEpoch uint64
	lastTick  uint64
	haveEpoch bool
	body      []byte
	rd        *bufio.Reader
}

// OpenLive opens the spool file at path for Update reads, from its start.
func OpenLive(path string) (*Live, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var hdr [spool.HdrSize]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil || string(hdr[:8]) != spool.Magic {
		f.Close()
		return nil, fmt.Errorf("%s: not an msmemscope spool", path)
	}
	return &Live{f: f, off: spool.HdrSize, lives: u64map.Map[addrLife]{Runs: true, Grain: 4},
		decs: map[int32]*spool.RecDecoder{}, epochTick: map[uint64]uint64{}}, nil
}

// Offset is how many bytes of the file the Updates have read.
func (l *Live) Offset() int64 { return l.off }

// Close closes the file; Blocks still answers.
func (l *Live) Close() error { return l.f.Close() }

// maxChunk bounds a chunk's size: a drained segment is 2 MiB; a header
// saying more is corrupt, not a reason to allocate gigabytes.
const maxChunk = 64 << 20

// Update reads the whole chunks the file holds beyond those read before (a
// chunk still being written is read by a later Update).
func (l *Live) Update() error { return l.UpdateUntil(nil) }

// UpdateUntil is Update that returns early, between two chunks, once stop
// is set (the next Update goes on from there).
func (l *Live) UpdateUntil(stop *atomic.Bool) error {
	fi, err := l.f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	sec := io.NewSectionReader(l.f, l.off, max(0, size-l.off))
	if l.rd == nil {
		l.rd = bufio.NewReaderSize(sec, 1<<20)
	} else {
		l.rd.Reset(sec)
	}
	r := l.rd
	var ch [spool.ChunkHdrSize]byte
	for stop == nil || !stop.Load() {
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			return nil // the end (or a chunk header not yet whole)
		}
		magic := binary.LittleEndian.Uint32(ch[format.ChunkMagicOff:])
		n := int(binary.LittleEndian.Uint32(ch[format.ChunkNUnitOff:])) * spool.UnitSize
		if n > maxChunk {
			return fmt.Errorf("%s: corrupt chunk header at offset %d (%d bytes)", l.f.Name(), l.off, n)
		}
		if magic != format.ChunkMagic { // padding
			if d, _ := r.Discard(n); d < n {
				return nil
			}
			l.off += int64(len(ch) + n)
			continue
		}
		if cap(l.body) < n {
			l.body = make([]byte, n)
		}
		body := l.body[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			return nil
		}
		l.off += int64(len(ch) + n)
		l.chunk(int32(binary.LittleEndian.Uint32(ch[format.ChunkTidOff:])), body)
	}
	return nil
}

// chunk counts the MALLOCs and FREEs of one thread's chunk.
func (l *Live) chunk(tid int32, body []byte) {
	d := l.decs[tid]
	if d == nil {
		d = &spool.RecDecoder{}
		l.decs[tid] = d
	}
	for b := body; len(b) > 0; {
		rec, size, ok := d.Next(b)
		if !ok {
			break
		}
		b = b[size:]
		switch rec.Kind {
		case format.RCalib:
			if rec.Flags&format.FEpoch != 0 {
				l.epochTick[rec.B] = rec.TS
				l.haveEpoch = false
			}
		case format.RMalloc, format.RFree:
			if rec.Flags&format.FSubMask != format.FHost {
				continue
			}
			t := rec.TS
			if t&spool.TSEpoch != 0 {
				if e := t &^ spool.TSEpoch; e != l.lastEpoch || !l.haveEpoch {
					l.lastEpoch, l.lastTick, l.haveEpoch = e, l.epochTick[e], true
				}
				t = l.lastTick // epochs change seldom: one lookup a run
			}
			a := l.lives.Slot(rec.A)
			if rec.Kind == format.RFree {
				a.frees++
			} else {
				a.mallocs++
				// A failed realloc's MALLOC brings back the block
				// just freed, at its size.
				if rec.Flags&format.FUndo == 0 && (a.mallocs == 1 || t >= a.lastM) {
					a.lastM, a.size = t, rec.B
				}
			}
		}
	}
}

// Blocks returns the blocks live after the chunks read, by address.
func (l *Live) Blocks() []Block {
	var out []Block
	l.lives.Each(func(a uint64, b *addrLife) {
		if b.live() {
			out = append(out, Block{Addr: a, Size: b.size})
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// LiveFromSpool returns the HOST blocks live at the end of a spool file, by
// address, reading what the file holds when it starts (threads still
// running may append).
func LiveFromSpool(path string) ([]Block, error) {
	l, err := OpenLive(path)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if err := l.Update(); err != nil {
		return nil, err
	}
	return l.Blocks(), nil
}

func (l *addrLife) live() bool { return l.mallocs > l.frees }
