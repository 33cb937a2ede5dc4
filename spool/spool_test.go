package spool

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/trace"
)

// spoolBuilder writes synthetic spools in the layout of format/records.def.
type spoolBuilder struct{ b bytes.Buffer }

func newSpoolBuilder(pid int) *spoolBuilder {
	sb := &spoolBuilder{}
	_ = WriteHeader(&sb.b, pid)
	return sb
}

type rec struct {
	ts, a, b    uint64
	kind, flags uint16
	payload     []byte
}

func (sb *spoolBuilder) chunk(tid int32, recs ...rec) {
	var body []byte
	for _, r := range recs {
		body = AppendRec(body, &Rec{TS: r.ts, A: r.a, B: r.b, Kind: r.kind, Flags: r.flags, Payload: r.payload})
	}
	sb.units(tid, body)
}

// units writes one chunk of raw units (compact records, say).
func (sb *spoolBuilder) units(tid int32, body []byte) {
	sb.b.Write(AppendChunk(nil, chunkMagic, tid, body))
}

func (sb *spoolBuilder) open(t *testing.T) *Spool {
	t.Helper()
	p := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(p, sb.b.Bytes(), 0o640); err != nil {
		t.Fatal(err)
	}
	s, err := OpenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// epoch-start calibration with ticks == ns, so times are easy to read.
func calib(tick, epoch uint64) rec {
	return rec{ts: tick, a: tick, b: epoch, kind: format.RCalib, flags: format.FEpoch}
}

func ep(e uint64) uint64 { return TSEpoch | e }

type got struct {
	tid  int32
	kind uint16
	a    uint64
	ns   uint64
}

// decodeRows decodes every event of d, each written by row.
func decodeRows(t *testing.T, d *Decoder, row func(*trace.Event) string) []string {
	t.Helper()
	var dst trace.Event
	var rows []string
	for {
		e, err := d.NextInto(&dst)
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			return rows
		}
		rows = append(rows, row(e))
	}
}

func readSpool(t *testing.T, r *Reader) []got {
	t.Helper()
	var out []got
	eachRec(t, r, func(rc *Rec, ns uint64) { out = append(out, got{rc.Tid, rc.Kind, rc.A, ns}) })
	return out
}

// eachRec hands every record of r but the calibrations to f, in order.
func eachRec(t *testing.T, r *Reader, f func(rc *Rec, ns uint64)) {
	t.Helper()
	for {
		rc, ns, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if rc == nil {
			return
		}
		if rc.Kind != format.RCalib {
			f(rc, ns)
		}
	}
}

// deliveredOrder runs r with an allocator state (SetLive) kept from the
// MALLOCs and FREEs it delivers, checks that times never go back, and
// returns name of each of those records, in order.
func deliveredOrder(t *testing.T, r *Reader, name func(*Rec) string) []string {
	t.Helper()
	live := map[BlockKey]bool{}
	r.SetLive(func(k BlockKey) bool { return live[k] })
	var got []string
	var prev uint64
	eachRec(t, r, func(rc *Rec, ns uint64) {
		switch rc.Kind {
		case format.RMalloc:
			live[KeyOf(rc)] = true
		case format.RFree:
			delete(live, KeyOf(rc))
		default:
			return
		}
		if ns < prev {
			t.Errorf("record %d %#x of thread %d at %d, after a record at %d", rc.Kind, rc.A, rc.Tid, ns, prev)
		}
		prev = ns
		got = append(got, name(rc))
	})
	return got
}

func TestSpoolInterpolatesEpochStamps(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2), calib(3000, 3))
	sb.chunk(5,
		rec{ts: 1100, a: 1, kind: format.RMalloc, b: 8},
		rec{ts: ep(1), a: 2, kind: format.RMalloc, b: 8},
		rec{ts: ep(1), a: 3, kind: format.RMalloc, b: 8},
		rec{ts: ep(1), a: 4, kind: format.RMalloc, b: 8},
		rec{ts: 1500, a: 5, kind: format.RMalloc, b: 8},
		// two epoch-1 records, then the next precise stamp lies in epoch 2:
		// their times stay inside epoch 1 (before 2000).
		rec{ts: ep(1), a: 6, kind: format.RMalloc, b: 8},
		rec{ts: ep(1), a: 7, kind: format.RMalloc, b: 8},
		rec{ts: 2900, a: 8, kind: format.RMalloc, b: 8},
	)
	s := sb.open(t)
	want := []uint64{1100, 1200, 1300, 1400, 1500, 1666, 1833, 2900}
	g := readSpool(t, s.Reader())
	if len(g) != len(want) {
		t.Fatalf("got %d records, want %d", len(g), len(want))
	}
	for i, w := range want {
		if g[i].ns != w || g[i].a != uint64(i+1) {
			t.Errorf("record %d: a=%d ns=%d, want a=%d ns=%d", i, g[i].a, g[i].ns, i+1, w)
		}
	}
}

func TestSpoolMergesThreadsByTime(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(5000, 2))
	sb.chunk(1, rec{ts: 1100, a: 1, kind: format.RMalloc}, rec{ts: 1300, a: 3, kind: format.RMalloc})
	sb.chunk(2, rec{ts: 1200, a: 2, kind: format.RMalloc}, rec{ts: 1400, a: 4, kind: format.RMalloc})
	sb.chunk(1, rec{ts: 1500, a: 5, kind: format.RMalloc})
	g := readSpool(t, sb.open(t).Reader())
	for i, r := range g {
		if r.a != uint64(i+1) {
			t.Fatalf("order %v", g)
		}
	}
	if len(g) != 5 {
		t.Fatalf("got %d records", len(g))
	}
}

// A MALLOC whose interpolated time falls before another thread's FREE of the
// same address is held back until that FREE, and never comes out earlier.
// Direct writes pad the spool to 4 KiB boundaries with padding chunks, whose
// contents are whatever the segment held: readers skip them whole.
func TestSpoolSkipsPaddingChunks(t *testing.T) {
	sb := newSpoolBuilder(7)
	pad := func(nunit int) {
		var ch [ChunkHdrSize]byte
		binary.LittleEndian.PutUint32(ch[0:], padMagic)
		binary.LittleEndian.PutUint32(ch[4:], uint32(nunit))
		sb.b.Write(ch[:])
		sb.b.Write(bytes.Repeat([]byte{0x43, 0x48, 0x4e, 0x4b}, nunit*2)) // looks like chunk magic
	}
	sb.chunk(0, calib(1000, 1), calib(5000, 2))
	pad(0)
	sb.chunk(1, rec{ts: 1100, a: 1, kind: format.RMalloc}, rec{ts: 1300, a: 3, kind: format.RMalloc})
	pad(509)
	sb.chunk(2, rec{ts: 1200, a: 2, kind: format.RMalloc})
	pad(3)
	s := sb.open(t)
	g := readSpool(t, s.Reader())
	if len(g) != 3 || g[0].a != 1 || g[1].a != 2 || g[2].a != 3 || s.Truncated {
		t.Fatalf("got %v (truncated %v), want the 3 records of the real chunks", g, s.Truncated)
	}

	// A run killed while writing a padded segment: the padding runs past the end.
	sb.chunk(1, rec{ts: 1400, a: 4, kind: format.RMalloc})
	pad(100)
	sb.b.Truncate(sb.b.Len() - 80)
	s = sb.open(t)
	if g := readSpool(t, s.Reader()); len(g) != 4 || !s.Truncated {
		t.Fatalf("got %v (truncated %v), want 4 records and a truncated spool", g, s.Truncated)
	}
}

func TestSpoolParkUntilFree(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2))
	sb.chunk(1, rec{ts: 1100, a: 0xA0, b: 16, kind: format.RMalloc, flags: format.FHost}, rec{ts: 1600, a: 0xA0, kind: format.RFree, flags: format.FHost})
	sb.chunk(2, rec{ts: 1200, a: 0xB0, b: 16, kind: format.RMalloc, flags: format.FHost},
		rec{ts: ep(1), a: 0xA0, b: 32, kind: format.RMalloc, flags: format.FHost},
		rec{ts: 1700, a: 0xC0, b: 16, kind: format.RMalloc, flags: format.FHost})
	r := sb.open(t).Reader()
	live := map[BlockKey]int32{}
	r.SetLive(func(k BlockKey) bool { _, ok := live[k]; return ok })
	var order []uint64
	var times []uint64
	for {
		rc, ns, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if rc == nil {
			break
		}
		k := KeyOf(rc)
		switch rc.Kind {
		case format.RMalloc:
			live[k] = rc.Tid
		case format.RFree:
			delete(live, k)
		default:
			continue
		}
		order = append(order, rc.A)
		times = append(times, ns)
	}
	wantOrder := []uint64{0xA0, 0xB0, 0xA0, 0xA0, 0xC0} // malloc A, malloc B, free A, malloc A (thread 2), malloc C
	if len(order) != len(wantOrder) {
		t.Fatalf("order %x, want %x", order, wantOrder)
	}
	for i := range wantOrder {
		if order[i] != wantOrder[i] {
			t.Fatalf("order %x, want %x", order, wantOrder)
		}
	}
	if times[3] < times[2] {
		t.Errorf("re-delivered MALLOC at %d before the FREE at %d", times[3], times[2])
	}
	for i := 1; i < len(times); i++ {
		if times[i] < times[i-1] {
			t.Errorf("times go back: %v", times)
		}
	}
}

// A held-back MALLOC whose FREE never comes is delivered once no other
// thread's next record can have happened before it (here: thread 1's
// stream ends; its next stamp is within a stamp's jitter of the MALLOC),
// marked Forced and counted; the stream never goes back in time.
func TestSpoolParkedWithoutFreeKeepsOrder(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2))
	sb.chunk(1, rec{ts: 1100, a: 0xA0, b: 16, kind: format.RMalloc, flags: format.FHost}, rec{ts: 1900, a: 0xD0, b: 16, kind: format.RMalloc, flags: format.FHost})
	sb.chunk(2, rec{ts: 1200, a: 0xA0, b: 32, kind: format.RMalloc, flags: format.FHost})
	r := sb.open(t).Reader()
	got := deliveredOrder(t, r, func(rc *Rec) string { return fmt.Sprintf("%d:%#x", rc.Tid, rc.A) })
	if want := "[1:0xa0 1:0xd0 2:0xa0]"; fmt.Sprint(got) != want {
		t.Errorf("got %v, want %s", got, want)
	}
	if r.Stats.LostFree != 1 || r.Stats.UnpairedFree != 0 {
		t.Errorf("stats %+v, want one MALLOC whose holder's FREE was lost", r.Stats)
	}
}

func TestSpoolTruncatedChunkKeepsWholeEvents(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1))
	sb.chunk(3, rec{ts: 1100, a: 1, kind: format.RMalloc}, rec{ts: 1200, a: 2, kind: format.RMark, b: 40, flags: format.FText, payload: bytes.Repeat([]byte("x"), 40)}, rec{ts: 1300, a: 3, kind: format.RMalloc})
	full := sb.b.Bytes()
	// Cut inside the mark's payload: only the first MALLOC survives.
	sb.b.Truncate(len(full) - RecSize - RecSize/2 - RecSize)
	s := sb.open(t)
	if !s.Truncated {
		t.Error("truncation not noticed")
	}
	g := readSpool(t, s.Reader())
	if len(g) != 1 || g[0].a != 1 {
		t.Fatalf("got %v, want only the first MALLOC", g)
	}
}

func TestSpoolRejectsForeignFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.bin")
	os.WriteFile(p, []byte("not a spool at all, clearly"), 0o640)
	if _, err := OpenFile(p); err == nil {
		t.Fatal("a foreign file was accepted")
	}
	sb := newSpoolBuilder(1)
	sb.b.WriteString("garbage-garbage-garbage")
	p2 := filepath.Join(t.TempDir(), FileName)
	os.WriteFile(p2, sb.b.Bytes(), 0o640)
	if _, err := OpenFile(p2); err == nil {
		t.Fatal("a corrupt chunk header was accepted")
	}
}

// Compact records (the hot path's MALLOC and FREE) carry no stamp: they take
// their thread's epoch from the R_EPOCH before them, across chunks.
func TestSpoolCompactRecordsTakeTheThreadsEpoch(t *testing.T) {
	compactMalloc := func(ptr, size uint64, site uint32) []byte {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[0:], ptr|compactBit|uint64(format.FHost)<<48)
		binary.LittleEndian.PutUint64(b[8:], size|uint64(site)<<48)
		return b[:]
	}
	compactFree := func(ptr uint64) []byte {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[0:], ptr|compactBit|compactFree|uint64(format.FHost|format.FOff)<<48)
		return b[:]
	}
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2), calib(3000, 3))
	body := AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(1)})
	body = AppendRec(body, &Rec{Kind: format.RMalloc, TS: 1100, A: 0x10, B: 1, Flags: format.FHost, Site: 3})
	body = append(body, compactMalloc(0x20, 2, 9)...)
	body = append(body, compactFree(0x10)...)
	sb.units(5, body)
	// The next drain's chunk continues epoch 1, then the thread enters epoch 2.
	body = append(compactMalloc(0x30, 1<<40, 65535), AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(2)})...)
	body = AppendRec(body, &Rec{Kind: format.RFree, TS: 2200, A: 0x20, Flags: format.FHost})
	body = append(body, compactFree(0x30)...)
	sb.units(5, body)
	s := sb.open(t)
	if s.Records != 3+6 {
		t.Fatalf("indexed %d events, want 9 (3 calibrations, 6 events; R_EPOCH is none)", s.Records)
	}
	type want struct {
		kind      uint16
		a, b      uint64
		flags     uint16
		site      uint32
		nsLo, nsH uint64
	}
	wants := []want{
		{format.RMalloc, 0x10, 1, format.FHost, 3, 1100, 1100},
		{format.RMalloc, 0x20, 2, format.FHost, 9, 1101, 1999},
		{format.RFree, 0x10, 0, format.FHost | format.FOff, 0, 1101, 1999},
		{format.RMalloc, 0x30, 1 << 40, format.FHost, 65535, 1101, 1999},
		{format.RFree, 0x20, 0, format.FHost, 0, 2200, 2200},
		{format.RFree, 0x30, 0, format.FHost | format.FOff, 0, 2201, 2999},
	}
	rd := s.Reader()
	var prev uint64
	for i := 0; ; {
		r, ns, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			if i != len(wants) {
				t.Fatalf("read %d events, want %d", i, len(wants))
			}
			break
		}
		if r.Kind == format.RCalib {
			continue
		}
		w := wants[i]
		if r.Kind != w.kind || r.A != w.a || r.B != w.b || r.Flags != w.flags || r.Site != w.site || r.Tid != 5 {
			t.Errorf("event %d: %+v, want %+v", i, *r, w)
		}
		if ns < w.nsLo || ns > w.nsH || ns < prev {
			t.Errorf("event %d at %d ns, want within [%d, %d] and not before %d", i, ns, w.nsLo, w.nsH, prev)
		}
		prev = ns
		i++
	}
}

// A short MALLOC (one unit) has the site of its thread's previous MALLOC,
// across chunks and whatever other threads wrote in between.
func TestSpoolShortMallocTakesThePreviousSite(t *testing.T) {
	unit := func(w uint64) []byte { return binary.LittleEndian.AppendUint64(nil, w) }
	long := func(ptr, size uint64, site uint32) []byte {
		return append(unit(ptr|compactBit|uint64(format.FHost)<<48), unit(size|uint64(site)<<48)...)
	}
	short := func(ptr, size uint64, off bool) []byte {
		w := compactBit | compactShort | size<<43 | ptr>>4
		if off {
			w |= compactOff
		}
		return unit(w)
	}
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2))
	body := AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(1)})
	body = AppendRec(body, &Rec{Kind: format.RMalloc, TS: 1100, A: 0x10, B: 1, Flags: format.FHost, Site: 3})
	body = append(body, short(0x20, 16, false)...)
	body = append(body, long(0x30, 8, 9)...)
	body = append(body, short(0x40, 1<<17-1, true)...)
	sb.units(5, body)
	body = AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(1)})
	body = append(body, long(0x100, 8, 4)...)
	body = append(body, short(0x110, 1, false)...)
	sb.units(6, body)
	sb.units(5, short(1<<47-16, 5, false))
	s := sb.open(t)
	if s.Records != 2+7 {
		t.Fatalf("indexed %d events, want 9", s.Records)
	}
	type ev struct {
		a, b  uint64
		site  uint32
		flags uint16
	}
	want := map[int32][]ev{
		5: {{0x10, 1, 3, format.FHost}, {0x20, 16, 3, format.FHost}, {0x30, 8, 9, format.FHost}, {0x40, 1<<17 - 1, 9, format.FHost | format.FOff}, {1<<47 - 16, 5, 9, format.FHost}},
		6: {{0x100, 8, 4, format.FHost}, {0x110, 1, 4, format.FHost}},
	}
	got := map[int32][]ev{}
	eachRec(t, s.Reader(), func(r *Rec, _ uint64) {
		if r.Kind == format.RMalloc {
			got[r.Tid] = append(got[r.Tid], ev{r.A, r.B, r.Site, r.Flags})
		}
	})
	for tid, w := range want {
		if fmt.Sprint(got[tid]) != fmt.Sprint(w) {
			t.Errorf("thread %d: MALLOCs %x, want %x", tid, got[tid], w)
		}
	}
}

// Pair units hold two hot events as distances from the thread's last
// address (that of any compact record), a MALLOC half with the site of the
// thread's previous MALLOC; a unit whose second half is empty holds one. The
// thread's past carries across chunks, and another thread's records do not
// touch it.
func TestSpoolPairUnits(t *testing.T) {
	unit := func(w uint64) []byte { return binary.LittleEndian.AppendUint64(nil, w) }
	long := func(ptr, size uint64, site uint32) []byte {
		return append(unit(ptr|compactBit|uint64(format.FHost)<<48), unit(size|uint64(site)<<48)...)
	}
	free := func(d int64) uint64 { return uint64(d>>4) & (1<<28 - 1) }
	malloc := func(size uint64, d int64) uint64 { return pairMalloc | size<<pairMShift | uint64(d>>4)&(1<<17-1) }
	pair := func(h1, h2 uint64, second bool) []byte {
		w := pairBits | h1<<32
		if second {
			w |= pairSecond | h2
		}
		return unit(w)
	}
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2))
	body := AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(1)})
	body = append(body, long(0x7f0000100000, 64, 3)...)
	body = append(body, pair(malloc(2047, 0x1000), free(-0x1000), true)...)  // MALLOC at +0x1000, FREE at base
	body = append(body, pair(malloc(16, -(1<<20)), free(1<<31-16), true)...) // the farthest each half reaches
	sb.units(5, body)
	other := AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(1)})
	other = append(other, long(0x5000, 8, 4)...)
	sb.units(6, other)
	sb.units(5, pair(free(0x20), 0, false)) // one event: the second half is empty
	s := sb.open(t)
	if s.Records != 2+1+4+1+1 {
		t.Fatalf("indexed %d events, want 9", s.Records)
	}
	type ev struct {
		kind uint16
		a, b uint64
		site uint32
	}
	base := uint64(0x7f0000100000)
	want := map[int32][]ev{
		5: {{format.RMalloc, base, 64, 3}, {format.RMalloc, base + 0x1000, 2047, 3}, {format.RFree, base, 0, 0},
			{format.RMalloc, base - 1<<20, 16, 3}, {format.RFree, base - 1<<20 + 1<<31 - 16, 0, 0}, {format.RFree, base - 1<<20 + 1<<31 + 0x10, 0, 0}},
		6: {{format.RMalloc, 0x5000, 8, 4}},
	}
	got := map[int32][]ev{}
	eachRec(t, s.Reader(), func(r *Rec, _ uint64) {
		if r.Kind == format.RMalloc || r.Kind == format.RFree {
			if r.Flags != format.FHost {
				t.Errorf("flags %#x, want FHost", r.Flags)
			}
			got[r.Tid] = append(got[r.Tid], ev{r.Kind, r.A, r.B, r.Site})
		}
	})
	for tid, w := range want {
		if fmt.Sprint(got[tid]) != fmt.Sprint(w) {
			t.Errorf("thread %d: events %x, want %x", tid, got[tid], w)
		}
	}
	if !NeedsPast(pair(free(0), 0, false)) || NeedsPast(long(0x10, 1, 1)) {
		t.Error("NeedsPast must tell pair units from self-contained records")
	}
}

// A MALLOC whose C stack was written before (RStack) names it by id; the
// reader hands it out with the frames, as if they had come whole, and the
// RStack itself is not an event. An id without its RStack (a killed run)
// gives a MALLOC without stack.
func TestSpoolExpandsStackIDs(t *testing.T) {
	frames := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 0x401000), 0x402000)
	id := func(n uint64) []byte { return binary.LittleEndian.AppendUint64(nil, n) }
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2))
	sb.chunk(5,
		rec{ts: 1100, a: 7, b: 2, kind: format.RStack, flags: format.FCStack, payload: frames},
		rec{ts: 1200, a: 0x10, b: 8, kind: format.RMalloc, flags: format.FHost | format.FCStack | format.FStackID, payload: id(7)})
	sb.chunk(6, rec{ts: 1300, a: 0x20, b: 8, kind: format.RMalloc, flags: format.FHost | format.FCStack | format.FStackID, payload: id(7)},
		rec{ts: 1400, a: 0x30, b: 8, kind: format.RMalloc, flags: format.FHost | format.FCStack | format.FStackID, payload: id(9)})
	// The compact form: {ptr | flags << 48, size | site << 48, id}, in epoch 1.
	body := AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(1)})
	body = binary.LittleEndian.AppendUint64(body, 0x40|compactBit|uint64(format.FHost|format.FCStack|format.FStackID)<<48)
	body = binary.LittleEndian.AppendUint64(body, 24|3<<48)
	body = append(body, id(7)...)
	sb.units(8, body)
	var got []string
	eachRec(t, sb.open(t).Reader(), func(r *Rec, _ uint64) {
		c, _ := r.Stacks()
		got = append(got, fmt.Sprintf("%d %#x %#x %x", r.Kind, r.A, r.Flags, c))
	})
	want := []string{
		fmt.Sprintf("%d 0x10 %#x [401000 402000]", format.RMalloc, format.FHost|format.FCStack),
		fmt.Sprintf("%d 0x20 %#x [401000 402000]", format.RMalloc, format.FHost|format.FCStack),
		fmt.Sprintf("%d 0x30 %#x []", format.RMalloc, format.FHost),
		fmt.Sprintf("%d 0x40 %#x [401000 402000]", format.RMalloc, format.FHost|format.FCStack),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestDecodeRecRefusesCutEvents(t *testing.T) {
	full := AppendRec(nil, &Rec{Kind: format.RMark, TS: 5, A: 1, B: 3, Flags: format.FText, Payload: []byte("abc")})
	if len(full) != RecSize+UnitSize {
		t.Fatalf("full record with 3 payload bytes is %d bytes, want %d", len(full), RecSize+UnitSize)
	}
	r, n, ok := DecodeRec(full, 0, 0)
	if !ok || n != len(full) || r.Text() != "abc" || r.Kind != format.RMark || r.TS != 5 {
		t.Fatalf("round trip: %+v %d %v", r, n, ok)
	}
	for cut := 0; cut < len(full); cut += UnitSize {
		if _, _, ok := DecodeRec(full[:cut], 0, 0); ok {
			t.Errorf("a record cut to %d bytes decoded", cut)
		}
	}
	var m [8]byte
	binary.LittleEndian.PutUint64(m[:], 0x1000|compactBit)
	if _, _, ok := DecodeRec(m[:], 0, 0); ok {
		t.Error("a compact MALLOC without its second unit decoded")
	}
}

// Any bytes after a valid header: an error or records, never a panic or a
// hang (a killed run leaves a spool cut anywhere; a disk can hand back junk).
func FuzzSpool(f *testing.F) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2))
	body := AppendRec(nil, &Rec{Kind: format.REpoch, TS: ep(1)})
	body = AppendRec(body, &Rec{Kind: format.RMalloc, TS: 1100, A: 0x10, B: 1, Flags: format.FHost, Site: 3, Payload: []byte{1, 2, 3}})
	var c [24]byte
	binary.LittleEndian.PutUint64(c[0:], 0x20|compactBit|uint64(format.FHost)<<48)
	binary.LittleEndian.PutUint64(c[8:], 2|9<<48)
	binary.LittleEndian.PutUint64(c[16:], 0x20|compactBit|compactFree)
	sb.units(5, append(body, c[:]...))
	seed := sb.b.Bytes()
	// Version 6, whose chunks carry no checksum: mutated chunks reach the
	// decoder (a version-7 spool refuses them at their checksum).
	binary.LittleEndian.PutUint32(seed[8:], 6)
	f.Add(seed[HdrSize:])
	f.Fuzz(func(t *testing.T, rest []byte) {
		b := append(append([]byte(nil), seed[:HdrSize]...), rest...)
		s, err := New(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		rd := s.Reader()
		for n := 0; ; n++ {
			r, _, err := rd.Next()
			if err != nil || r == nil {
				return
			}
			// A pair unit holds two events: no more than two per unit.
			if n > 2*len(b)/UnitSize {
				t.Fatalf("more than two records per unit in %d bytes", len(b))
			}
		}
	})
}

// The stacks kept for blocks allocated while collection was off go with
// the blocks: freed while off too (no shadow MALLOC will need them) or
// replaced, none are left; a block freed while on still gets its shadow
// MALLOC.
func TestHiddenStacksGoWithTheirBlocks(t *testing.T) {
	sb := newSpoolBuilder(7)
	recs := []rec{calib(1000, 1)}
	ts := uint64(1001)
	for i := 0; i < 1000; i++ {
		recs = append(recs, rec{ts: ts, a: 0x1000 + uint64(i)*16, b: 8, kind: format.RMalloc, flags: format.FHost | format.FOff})
		recs = append(recs, rec{ts: ts + 1, a: 0x1000 + uint64(i)*16, kind: format.RFree, flags: format.FHost | format.FOff})
		ts += 2
	}
	recs = append(recs, rec{ts: ts, a: 0x8000, b: 8, kind: format.RMalloc, flags: format.FHost | format.FOff})
	recs = append(recs, rec{ts: ts + 1, a: 0x8000, b: 8, kind: format.RMalloc, flags: format.FHost | format.FOff}) // its FREE never seen
	recs = append(recs, rec{ts: ts + 2, a: 0x9000, b: 8, kind: format.RMalloc, flags: format.FHost | format.FOff})
	recs = append(recs, rec{ts: ts + 3, a: 0x9000, kind: format.RFree, flags: format.FHost})
	recs = append(recs, rec{ts: ts + 4, a: 0x8000, kind: format.RFree, flags: format.FHost | format.FOff})
	sb.chunk(5, recs...)
	d := NewDecoder(sb.open(t), "", &ProcessMeta{Pid: 7}, config.Config{})
	rows := decodeRows(t, d, func(e *trace.Event) string { return fmt.Sprintf("%v shadow=%v", e.Kind, e.Shadow) })
	if want := []string{"MALLOC shadow=true", "FREE shadow=false"}; !slices.Equal(rows, want) {
		t.Errorf("rows %q, want %q", rows, want)
	}
	if len(d.hidden) != 0 || d.live.Len() != 0 {
		t.Errorf("%d hidden blocks' stacks and %d live blocks left", len(d.hidden), d.live.Len())
	}
}

// Two held records that are both past every running thread's bounds: the
// first is released (its FREE was lost), and its thread's next record is
// the MALLOC the second waits for. The second must wait for it, not be
// released in the same pass as unpaired (a block the program freed would
// stay in use at exit).
// The same with thread 1's and 2's records stamped with their epoch only:
// their lower bounds are equal, and the merge's order decides (every time,
// not as a map's order falls).
func TestSpoolReleasesOneStaleRecordAtATime(t *testing.T) {
	for i := 0; i < 40; i++ {
		releaseOneStale(t, false)
		releaseOneStale(t, true)
	}
}

func releaseOneStale(t *testing.T, epochOnly bool) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(1_000_000, 2))
	mal := func(ts, a uint64) rec { return rec{ts: ts, a: a, b: 16, kind: format.RMalloc, flags: format.FHost} }
	stamp := func(ts uint64) uint64 {
		if epochOnly {
			return ep(1)
		}
		return ts
	}
	// thread 3 holds 0xB0 and never frees it; its next record comes much later
	sb.chunk(3, mal(50_000, 0xB0), mal(2_000_000, 0xE0))
	// thread 1: a MALLOC of 0xB0 (its holder's FREE was lost), then 0xA0
	sb.chunk(1, mal(stamp(100_000), 0xB0), mal(stamp(100_500), 0xA0))
	// thread 2 frees thread 1's 0xA0: its stamp is before the MALLOC's (jitter)
	sb.chunk(2, rec{ts: stamp(100_200), a: 0xA0, kind: format.RFree, flags: format.FHost})
	r := sb.open(t).Reader()
	got := deliveredOrder(t, r, func(rc *Rec) string {
		return fmt.Sprintf("%d:%s%#x", rc.Tid, map[uint16]string{format.RMalloc: "m", format.RFree: "f"}[rc.Kind], rc.A)
	})
	if want := "[3:m0xb0 1:m0xb0 1:m0xa0 2:f0xa0 3:m0xe0]"; fmt.Sprint(got) != want {
		t.Errorf("got %v, want %s", got, want)
	}
	if r.Stats.LostFree != 1 || r.Stats.UnpairedFree != 0 {
		t.Errorf("stats %+v, want one lost FREE (0xb0's) and no unpaired one", r.Stats)
	}
}

// The drain may be preempted between an epoch's calibration point and the
// gate's move to it: a thread reading the gate then labels its records
// with the old epoch although they come later. The calibration record says
// when the gate had moved (its payload), and the old epoch's records are
// bounded by that: here thread 1's MALLOC of 0xA0, labeled epoch 1, waits
// for thread 2's FREE (stamped after epoch 2's calibration, before the gate
// moved) instead of being forced as if that FREE were lost.
func TestSpoolEpochEndsWhenTheGateMoved(t *testing.T) {
	end := binary.LittleEndian.AppendUint64(nil, 400_000)
	for _, recorded := range []bool{true, false} {
		sb := newSpoolBuilder(7)
		c2 := calib(100_000, 2)
		if recorded {
			c2.payload = end
		}
		sb.chunk(0, calib(1000, 1), c2, calib(1_000_000, 3))
		sb.chunk(3, rec{ts: 10_000, a: 0xA0, b: 16, kind: format.RMalloc, flags: format.FHost})
		sb.chunk(2, rec{ts: 300_000, a: 0xA0, kind: format.RFree, flags: format.FHost})
		sb.chunk(1, rec{ts: ep(1), a: 0xA0, b: 32, kind: format.RMalloc, flags: format.FHost})
		r := sb.open(t).Reader()
		got := deliveredOrder(t, r, func(rc *Rec) string { return fmt.Sprintf("%d:%d", rc.Tid, rc.Kind) })
		if !recorded {
			// (a spool of an older msmemscope: the epoch ends at the next one's calibration)
			if r.Stats.LostFree != 1 {
				t.Errorf("without the end recorded: stats %+v, want the MALLOC forced", r.Stats)
			}
			continue
		}
		if want := "[3:1 2:2 1:1]"; fmt.Sprint(got) != want || r.Stats.Reordered != 1 || r.Stats.LostFree != 0 || r.Stats.UnpairedFree != 0 {
			t.Errorf("got %v stats %+v, want %s and one record held back", got, r.Stats, want)
		}
	}
}

// The merge's order is total: cursors that tie on time, thread and
// sequence (a thread's AHED or INHR chunks) come out by their place,
// whatever order they went in, by push or by push-pop.
func TestCursorHeapTotalOrder(t *testing.T) {
	for trial := 0; trial < 50; trial++ {
		r := rand.New(rand.NewSource(int64(trial)))
		var h cursorHeap
		cs := make([]*threadCursor, 8)
		for i := range cs {
			cs[i] = &threadCursor{idx: i, tid: 7, ns: uint64(r.Intn(2))}
		}
		perm := r.Perm(len(cs))
		for _, i := range perm[:6] {
			h.push(cs[i])
		}
		var got []*threadCursor
		got = append(got, h.pushPop(cs[perm[6]]))
		for len(h) > 0 {
			got = append(got, h.pop())
		}
		for i := 1; i < len(got); i++ {
			if h.Less2(got[i], got[i-1]) {
				t.Fatalf("trial %d: %d (ns %d) after %d (ns %d)", trial, got[i].idx, got[i].ns, got[i-1].idx, got[i-1].ns)
			}
		}
		if got[0].ns == got[1].ns && got[0].idx > got[1].idx {
			t.Fatalf("trial %d: a tie went by heap shape: %d before %d", trial, got[0].idx, got[1].idx)
		}
	}
}

// A chunk whose units do not match its checksum (a byte damaged on disk) is
// an error naming where it is, not other events; a spool of version 6,
// whose chunks hold the process id there, reads unchecked.
func TestSpoolDamagedChunk(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(1, rec{ts: 100, a: 0x1000, b: 16, kind: format.RMalloc, flags: format.FHost})
	second := int64(sb.b.Len())
	sb.chunk(1, rec{ts: 200, a: 0x1000, kind: format.RFree, flags: format.FHost})
	whole := append([]byte(nil), sb.b.Bytes()...)
	open := func(b []byte) (*Spool, error) {
		return New(bytes.NewReader(b), int64(len(b)))
	}
	if s, err := open(whole); err != nil || s.Records != 2 {
		t.Fatalf("whole: %v", err)
	}
	bad := append([]byte(nil), whole...)
	bad[second+ChunkHdrSize+format.RecAOff] ^= 0x40 // the FREE's address
	if _, err := open(bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("damaged chunk at byte %d", second)) {
		t.Fatalf("damaged: %v", err)
	}
	// Version 6: the same field held the pid, and nothing is checked.
	old := append([]byte(nil), bad...)
	binary.LittleEndian.PutUint32(old[8:], 6)
	binary.LittleEndian.PutUint32(old[HdrSize+format.ChunkCRCOff:], 4242)
	if s, err := open(old); err != nil || s.Records != 2 {
		t.Fatalf("version 6: %v", err)
	}
	// Cut inside the damaged chunk (a kill): its whole events are kept,
	// unchecked, as before.
	if s, err := open(bad[:len(bad)-8]); err != nil || !s.Truncated {
		t.Fatalf("cut: %v", err)
	}
}

// The checksum covers the chunk's thread too: a damaged tid is found.
func TestSpoolDamagedChunkThread(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(3, rec{ts: 100, a: 0x1000, b: 16, kind: format.RMalloc, flags: format.FHost})
	b := sb.b.Bytes()
	b[HdrSize+format.ChunkTidOff] ^= 1
	if _, err := New(bytes.NewReader(b), int64(len(b))); err == nil || !strings.Contains(err.Error(), "damaged chunk at byte 32") {
		t.Fatalf("tid damaged: %v", err)
	}
}
