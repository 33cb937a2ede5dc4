package leakscan

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sort"

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

// LiveFromSpool returns the HOST blocks live at the end of a spool file, by
// address. It reads each thread's records in order, without merging the
// threads by time: the allocator alternates MALLOCs and FREEs on an address,
// so their counts say whether it is live, whatever the order across threads
// (stamps only pick the latest MALLOC, whose size the block has). A block
// allocated before the capture and freed in it would count a FREE too many:
// the scan runs only where the capture began at the first allocation (the
// library preloaded or linked). It reads what the file holds when it starts
// (threads still running may append).
func LiveFromSpool(path string) ([]Block, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	r := bufio.NewReaderSize(io.LimitReader(f, fi.Size()), 1<<20)
	var hdr [spool.HdrSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil || string(hdr[:8]) != spool.Magic {
		return nil, fmt.Errorf("%s: not an msmemscope spool", path)
	}
	lives := u64map.Map[addrLife]{Runs: true, Grain: 4} // by address
	decs := map[int32]*spool.RecDecoder{}
	epochTick := map[uint64]uint64{}
	var lastEpoch, lastTick uint64
	var haveEpoch bool
	var ch [spool.ChunkHdrSize]byte
	var body []byte
	for {
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			break // the end (or a chunk header cut short: a killed run)
		}
		magic := binary.LittleEndian.Uint32(ch[format.ChunkMagicOff:])
		n := int(binary.LittleEndian.Uint32(ch[format.ChunkNUnitOff:])) * spool.UnitSize
		if cap(body) < n {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(r, body); err != nil {
			break
		}
		if magic != format.ChunkMagic {
			continue // padding
		}
		tid := int32(binary.LittleEndian.Uint32(ch[format.ChunkTidOff:]))
		d := decs[tid]
		if d == nil {
			d = &spool.RecDecoder{}
			decs[tid] = d
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
					epochTick[rec.B] = rec.TS
					haveEpoch = false
				}
			case format.RMalloc, format.RFree:
				if rec.Flags&format.FSubMask != format.FHost {
					continue
				}
				t := rec.TS
				if t&spool.TSEpoch != 0 {
					if e := t &^ spool.TSEpoch; e != lastEpoch || !haveEpoch {
						lastEpoch, lastTick, haveEpoch = e, epochTick[e], true
					}
					t = lastTick // epochs change seldom: one lookup a run
				}
				l := lives.Slot(rec.A)
				if rec.Kind == format.RFree {
					l.frees++
				} else {
					l.mallocs++
					// A failed realloc's MALLOC brings back the block
					// just freed, at its size.
					if rec.Flags&format.FUndo == 0 && (l.mallocs == 1 || t >= l.lastM) {
						l.lastM, l.size = t, rec.B
					}
				}
			}
		}
	}
	var out []Block
	lives.Each(func(a uint64, l *addrLife) {
		if l.live() {
			out = append(out, Block{Addr: a, Size: l.size})
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out, nil
}

func (l *addrLife) live() bool { return l.mallocs > l.frees }
