package spool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"msmemscope/format"
)

// Tail reads a spool that is still being written, a little at a time: each
// Read hands out the events of the whole chunks appended since the last one,
// in file order (each thread's in program order; threads drained in one pass
// follow one another). It keeps what compact records need of each thread's
// past, the allocation sites and the Python code objects, so the whole file
// is read once however often Read is called. It reads single spools only
// (not rotated logs: their chunks are compressed).
type Tail struct {
	f         *os.File
	off       int64
	buf       []byte
	dec       map[int32]*RecDecoder
	Sites     map[uint32]uint64 // site id -> return address of the allocator's caller
	StackTop  map[uint32]uint64 // C stack id -> its innermost frame (R_STACK: a record with F_STACKID names its stack so)
	EpochTick map[uint64]uint64 // drain epoch -> the tick it began at (the newest tailEpochs)
	EpochEnd  map[uint64]uint64 // drain epoch -> the tick by which it had ended (the next one's gate set), where recorded
	Py        PyMeta
}

// tailEpochs is how many recent epochs' ticks a Tail keeps.
const tailEpochs = 1 << 16

// maxChunk bounds a chunk's size: a drained segment is 2 MiB; a header
// saying more is corrupt, not a chunk to wait for.
const maxChunk = 64 << 20

// OpenTail opens the spool file at path for Tail reads, from its start.
func OpenTail(path string) (*Tail, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var hdr [HdrSize]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil || string(hdr[:8]) != Magic {
		f.Close()
		return nil, fmt.Errorf("%s: not an msmemscope spool (bad header)", path)
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v < format.SpoolMinVersion || v > Version {
		f.Close()
		return nil, fmt.Errorf("%s: spool format version %d, this msmemscope reads version %d", path, v, Version)
	}
	return &Tail{f: f, off: HdrSize, dec: map[int32]*RecDecoder{}, Sites: map[uint32]uint64{}, StackTop: map[uint32]uint64{}, EpochTick: map[uint64]uint64{}, EpochEnd: map[uint64]uint64{}}, nil
}

// Skipped reports whether Python frames of file are msmemscope's own (its
// package folder, as the spool noted it): left out of stacks.
func (t *Tail) Skipped(file string) bool { return t.Py.skip(file) }

// Close closes the file.
func (t *Tail) Close() error { return t.f.Close() }

// Offset is how many bytes of the file the Reads have read.
func (t *Tail) Offset() int64 { return t.off }

// Read hands fn every MALLOC and FREE record (with its thread id) in the
// whole chunks appended since the last Read; a chunk still being written
// waits for the next. Sites, epochs' start ticks, Python code objects and
// skipped folders are noted on the way. The record's payload is valid only during the call.
func (t *Tail) Read(fn func(r *Rec)) error { return t.ReadUntil(nil, fn) }

// ReadUntil is Read that returns early, between two chunks, once stop is
// set (the next Read goes on from there).
func (t *Tail) ReadUntil(stop *atomic.Bool, fn func(r *Rec)) error {
	fi, err := t.f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	var ch [ChunkHdrSize]byte
	var r Rec // one for the Read: fn keeps its address, so it lives on the heap
	for t.off+ChunkHdrSize <= size && (stop == nil || !stop.Load()) {
		if _, err := t.f.ReadAt(ch[:], t.off); err != nil {
			return err
		}
		nunit := int64(binary.LittleEndian.Uint32(ch[format.ChunkNUnitOff:]))
		magic := binary.LittleEndian.Uint32(ch[format.ChunkMagicOff:])
		end := t.off + ChunkHdrSize + nunit*UnitSize
		if nunit*UnitSize > maxChunk {
			return fmt.Errorf("corrupt chunk header at byte %d (%d bytes)", t.off, nunit*UnitSize)
		}
		if end > size {
			return nil // still being written
		}
		switch magic {
		case padMagic:
			t.off = end
			continue
		case chunkMagic:
		default:
			return fmt.Errorf("corrupt chunk header at byte %d (rotated logs cannot be tailed)", t.off)
		}
		tid := int32(binary.LittleEndian.Uint32(ch[format.ChunkTidOff:]))
		n := int(nunit) * UnitSize
		if cap(t.buf) < n {
			t.buf = make([]byte, n)
		}
		b := t.buf[:n]
		if _, err := t.f.ReadAt(b, t.off+ChunkHdrSize); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		t.off = end
		d := t.dec[tid]
		if d == nil {
			d = &RecDecoder{}
			t.dec[tid] = d
		}
		for pos := 0; pos < n; {
			var used int
			var ok bool
			used, ok = d.NextTo(b[pos:], &r)
			if !ok {
				break // cannot happen for a whole chunk
			}
			pos += used
			switch r.Kind {
			case format.RMalloc, format.RFree:
				r.Tid = tid
				fn(&r)
			case format.RSite:
				t.Sites[uint32(r.B)] = r.A
			case format.RStack:
				if len(r.Payload) >= UnitSize {
					t.StackTop[uint32(r.A)] = binary.LittleEndian.Uint64(r.Payload)
				}
			case format.RCalib:
				if r.Flags&format.FEpoch != 0 {
					t.EpochTick[r.B] = r.TS
					if e, tick, ok := EpochEndOf(&r); ok {
						t.EpochEnd[e] = tick
					}
					// A record comes at most a few epochs late: an hour's
					// epochs (a thousand a second) need not all be kept.
					delete(t.EpochTick, r.B-tailEpochs)
					delete(t.EpochEnd, r.B-tailEpochs)
				}
			case format.RPyCode, format.RPySkip, format.RConfig:
				t.Py.note(r.Kind, r.TS, r.A, r.B, r.Payload)
			}
		}
	}
	return nil
}
