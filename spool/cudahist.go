package spool

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"

	"msmemscope/format"
	"msmemscope/trace"
)

// PyTorch's CUDA tensor blocks. The caching allocator makes no driver call
// per tensor, so its blocks come from its own history, which the Python
// package reads while collection is on and appends to spool/HistoryFile
// (python/msmemscope/_cuda_history.py). The decoder merges those entries
// into the rows by time: a block's alloc and free are PTA MALLOC and FREE
// rows on its device, and the segments PyTorch reserved mark the HAL blocks
// that hold them (Owner HAL@pytorch). Both passes of a capture with PyTorch
// records read the same entries, so allocation ids agree.

// The entries are read once per Spool (Spool.history): the passes of one
// conversion see the same entries even while a running program appends.

// HistoryFile is the history's file in the spool folder.
const HistoryFile = "cuda_history.bin"

var historyMagic = []byte("MSCUDAH1")

const historyEntry = 40

// The history's actions (_cuda_history.py's A_*).
const (
	histAlloc    = 1
	histFree     = 2
	histSegAlloc = 3
	histSegFree  = 4
	histSegMap   = 5
	histSegUnmap = 6
	histAsync    = 7 // the process's allocator is cudaMallocAsync: its async driver blocks are tensors'
)

// subTensor keys a CUDA tensor block: it lies inside a HAL block and may
// start where that block starts.
const subTensor = 0xe

type histEntry struct {
	ns, addr, size, stream uint64
	action                 uint8
	dev                    int16
}

// cudaHistory is a capture's history as the decoders use it.
type cudaHistory struct {
	entries    []histEntry // alloc, free and segment entries, in time order
	asyncTorch bool        // histAsync: every async driver block is a tensor block
}

// history is the capture's history, read at the first call. None for a
// rotating capture: its logs stand alone, and the history spans the run.
func (s *Spool) history(dir string, rotate bool) *cudaHistory {
	s.histOnce.Do(func() {
		s.hist = &cudaHistory{}
		if rotate {
			return
		}
		for _, h := range readHistory(dir) {
			if h.action == histAsync {
				s.hist.asyncTorch = true
			} else {
				s.hist.entries = append(s.hist.entries, h)
			}
		}
	})
	return s.hist
}

// readHistory reads a capture's history file, in time order (entries of
// one time keep the file's order).
func readHistory(dir string) []histEntry {
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(dir, SpoolDir, HistoryFile))
	if err != nil || !bytes.HasPrefix(b, historyMagic) {
		return nil
	}
	b = b[len(historyMagic):]
	out := make([]histEntry, 0, len(b)/historyEntry)
	le := binary.LittleEndian
	for ; len(b) >= historyEntry; b = b[historyEntry:] { // (a write cut short leaves a part entry: dropped)
		out = append(out, histEntry{action: b[0], dev: int16(b[1]), ns: le.Uint64(b[8:]), addr: le.Uint64(b[16:]),
			size: le.Uint64(b[24:]), stream: le.Uint64(b[32:])})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ns < out[j].ns })
	return out
}

// tensorEntry turns a history entry into its row (nil: none).
func (d *Decoder) tensorEntry(h *histEntry) *trace.Event {
	switch h.action {
	case histSegAlloc, histSegMap, histSegUnmap, histSegFree:
		seg := uint64(0)
		if h.action == histSegAlloc {
			if seg = d.segBlock(h); seg != 0 {
				d.histTaken[seg] = true
			}
		}
		if d.torch != nil && d.torch.pre {
			d.torch.segment(d, h, seg)
		}
		return nil
	case histAlloc, histFree:
	default:
		return nil
	}
	d.events++
	key := uint64(MakeKey(subTensor, h.addr))
	var b block
	if h.action == histAlloc {
		d.nextAID++
		b = block{id: d.nextAID, size: h.size, dev: h.dev, tid: int32(d.pid)}
		d.live.Put(key, b)
	} else {
		var ok bool
		if b, ok = d.live.Take(key); !ok {
			d.unrowed[NotWrittenUntracked]++
			return nil
		}
	}
	// (Tid: the process's; the history does not say which thread allocated.)
	e := d.slot(max(h.ns, d.histFloor), int32(d.pid))
	if d.dst == nil {
		d.arena = d.arena[1:]
	}
	e.Kind, e.Type, e.Device = trace.KindFree, trace.TypePTA, deviceOf(b)
	e.Ptr, e.HasPtr = h.addr, true
	e.AllocID, e.Size = b.id, b.size
	if h.action == histAlloc {
		e.Kind, e.Owner = trace.KindMalloc, "PTA"
		if h.stream != 0 && !d.fast {
			e.Set("stream", "0x"+strconv.FormatUint(h.stream, 16))
		}
	}
	return e
}

// segBlock is the allocation id of the HAL block a segment_alloc entry
// made: the live one at its address, of its size, that no earlier
// segment_alloc took (a block still live there of the same size may be an
// old segment whose FREE row is yet to come); 0 when there is none yet.
func (d *Decoder) segBlock(h *histEntry) uint64 {
	b, ok := d.live.Get(uint64(MakeKey(format.FHal, h.addr)))
	if !ok || b.size != h.size || d.histTaken[b.id] {
		return 0
	}
	return b.id
}

// segment learns which HAL blocks PyTorch's allocator reserved: the
// cuMemAlloc block a segment starts at (seg, from segBlock), or the
// cuMemCreate handles mapped into a range it maps (expandable segments).
// The driver's call and the history's entry are stamped by two clocks:
// either may come first.
func (t *torchDec) segment(d *Decoder, h *histEntry, seg uint64) {
	switch h.action {
	case histSegFree:
		delete(t.segAt, h.addr)
		return
	case histSegUnmap:
		t.segRanges = slices.DeleteFunc(t.segRanges, func(r [2]uint64) bool { return r[0] >= h.addr && r[1] <= h.addr+h.size })
		return
	case histSegAlloc:
		if seg != 0 {
			t.seg[seg] = true
		} else {
			t.segAt[h.addr] = true // its MALLOC row is still to come
		}
		return
	}
	t.segRanges = append(t.segRanges, [2]uint64{h.addr, h.addr + h.size})
	for va, id := range t.maps {
		if va >= h.addr && va < h.addr+h.size {
			t.seg[id] = true
		}
	}
}

// halMalloc, in the first pass, marks a HAL block whose segment entry came
// before it.
func (t *torchDec) halMalloc(e *trace.Event) {
	if len(t.segAt) > 0 && t.segAt[e.Ptr] {
		delete(t.segAt, e.Ptr)
		t.seg[e.AllocID] = true
	}
}

// mapping notes, in the first pass, which handle a MAP row maps where; one
// into a range PyTorch mapped is PyTorch's.
func (t *torchDec) mapping(d *Decoder, r *Rec) {
	if r.Kind == format.RVmmUnmap {
		delete(t.maps, r.A)
		return
	}
	if len(r.Payload) < 16 {
		return
	}
	b, ok := d.live.Get(uint64(MakeKey(format.FVmm, binary.LittleEndian.Uint64(r.Payload[8:]))))
	if !ok {
		return
	}
	t.maps[r.A] = b.id
	for _, rg := range t.segRanges {
		if r.A >= rg[0] && r.A < rg[1] {
			t.seg[b.id] = true
		}
	}
}

// histWait is how long, in the records' time, the history's segment_alloc
// waits for its driver call. The two are stamped by two clocks: PyTorch
// converts its entries' times from the TSC (measuring the conversion again
// at each read), and on an H100 they came microseconds before the call's
// row, although the call came first. Without the wait, the blocks
// allocated in a new segment would come before the segment (memory_viz
// showed them as blocks outside any). Every later entry waits with it, so
// the wait is short: a segment whose call has no row holds the history
// back this long at most.
const histWait = 1_000_000

// histFirst says whether the next history entry goes before record r, due
// at ns. A segment_alloc whose HAL block is not live yet (segBlock) waits
// (up to histWait) for the MALLOC row at its address, of its size: the
// records before it go first, and the entries held back follow them, their
// rows at the last record's time (histFloor). Both passes decide alike.
func (d *Decoder) histFirst(r *Rec, ns uint64) bool {
	h := &d.hist[d.hi]
	if max(h.ns, d.histFloor) > ns {
		return false
	}
	if h.action == histSegAlloc && ns <= h.ns+histWait && d.segBlock(h) == 0 {
		d.histFloor = max(d.histFloor, ns)
		return false
	}
	return true
}

// heldRec is the record held back while history entries before it were
// merged (nil once the reader is done: Next calls the reader itself).
func (d *Decoder) heldRec() (*Rec, uint64) {
	r := d.held
	d.held = nil
	return r, d.heldNs
}
