package trace

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// spoolBuilder writes synthetic spools in the layout of libmemscope/hook.h.
type spoolBuilder struct{ b bytes.Buffer }

func newSpoolBuilder(pid int) *spoolBuilder {
	sb := &spoolBuilder{}
	_ = WriteSpoolHeader(&sb.b, pid)
	return sb
}

type rec struct {
	ts, a, b    uint64
	kind, flags uint16
	payload     []byte
}

func (sb *spoolBuilder) chunk(tid int32, recs ...rec) {
	var body bytes.Buffer
	n := 0
	for _, r := range recs {
		cont := (len(r.payload) + RecSize - 1) / RecSize
		var h [RecSize]byte
		binary.LittleEndian.PutUint64(h[0:], r.ts)
		binary.LittleEndian.PutUint64(h[8:], r.a)
		binary.LittleEndian.PutUint64(h[16:], r.b)
		binary.LittleEndian.PutUint16(h[24:], r.kind)
		binary.LittleEndian.PutUint16(h[26:], r.flags)
		binary.LittleEndian.PutUint32(h[28:], uint32(cont))
		body.Write(h[:])
		p := make([]byte, cont*RecSize)
		copy(p, r.payload)
		body.Write(p)
		n += 1 + cont
	}
	var ch [ChunkHdrSize]byte
	binary.LittleEndian.PutUint32(ch[0:], chunkMagic)
	binary.LittleEndian.PutUint32(ch[4:], uint32(n))
	binary.LittleEndian.PutUint32(ch[8:], uint32(tid))
	sb.b.Write(ch[:])
	sb.b.Write(body.Bytes())
}

func (sb *spoolBuilder) open(t *testing.T) *Spool {
	t.Helper()
	p := filepath.Join(t.TempDir(), SpoolFileName)
	if err := os.WriteFile(p, sb.b.Bytes(), 0o640); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSpool(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// epoch-start calibration with ticks == ns, so times are easy to read.
func calib(tick, epoch uint64) rec {
	return rec{ts: tick, a: tick, b: epoch, kind: RCalib, flags: FEpoch}
}

func ep(e uint64) uint64 { return TSEpoch | e }

type got struct {
	tid  int32
	kind uint16
	a    uint64
	ns   uint64
}

func readSpool(t *testing.T, r *SpoolReader) []got {
	t.Helper()
	var out []got
	for {
		rc, ns, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if rc == nil {
			return out
		}
		if rc.Kind == RCalib {
			continue
		}
		out = append(out, got{rc.Tid, rc.Kind, rc.A, ns})
	}
}

func TestSpoolInterpolatesEpochStamps(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2), calib(3000, 3))
	sb.chunk(5,
		rec{ts: 1100, a: 1, kind: RMalloc, b: 8},
		rec{ts: ep(1), a: 2, kind: RMalloc, b: 8},
		rec{ts: ep(1), a: 3, kind: RMalloc, b: 8},
		rec{ts: ep(1), a: 4, kind: RMalloc, b: 8},
		rec{ts: 1500, a: 5, kind: RMalloc, b: 8},
		// two epoch-1 records, then the next precise stamp lies in epoch 2:
		// their times stay inside epoch 1 (before 2000).
		rec{ts: ep(1), a: 6, kind: RMalloc, b: 8},
		rec{ts: ep(1), a: 7, kind: RMalloc, b: 8},
		rec{ts: 2900, a: 8, kind: RMalloc, b: 8},
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
	sb.chunk(1, rec{ts: 1100, a: 1, kind: RMalloc}, rec{ts: 1300, a: 3, kind: RMalloc})
	sb.chunk(2, rec{ts: 1200, a: 2, kind: RMalloc}, rec{ts: 1400, a: 4, kind: RMalloc})
	sb.chunk(1, rec{ts: 1500, a: 5, kind: RMalloc})
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
func TestSpoolParkUntilFree(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1), calib(2000, 2))
	sb.chunk(1, rec{ts: 1100, a: 0xA0, b: 16, kind: RMalloc, flags: FHost}, rec{ts: 1600, a: 0xA0, kind: RFree, flags: FHost})
	sb.chunk(2, rec{ts: 1200, a: 0xB0, b: 16, kind: RMalloc, flags: FHost},
		rec{ts: ep(1), a: 0xA0, b: 32, kind: RMalloc, flags: FHost}, // interpolated to ~1400: too early
		rec{ts: 1700, a: 0xC0, b: 16, kind: RMalloc, flags: FHost})
	r := sb.open(t).Reader()
	live := map[BlockKey]int32{}
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
		k := BlockKey{rc.Flags & FSubMask, rc.A}
		switch rc.Kind {
		case RMalloc:
			if owner, ok := live[k]; ok && owner != rc.Tid && !rc.Forced {
				r.Park(k)
				continue
			}
			live[k] = rc.Tid
		case RFree:
			delete(live, k)
			r.Wake(k, ns)
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

func TestSpoolTruncatedChunkKeepsWholeEvents(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1))
	sb.chunk(3, rec{ts: 1100, a: 1, kind: RMalloc}, rec{ts: 1200, a: 2, kind: RMark, b: 40, flags: FText, payload: bytes.Repeat([]byte("x"), 40)}, rec{ts: 1300, a: 3, kind: RMalloc})
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
	if _, err := OpenSpool(p); err == nil {
		t.Fatal("a foreign file was accepted")
	}
	sb := newSpoolBuilder(1)
	sb.b.WriteString("garbage-garbage-garbage")
	p2 := filepath.Join(t.TempDir(), SpoolFileName)
	os.WriteFile(p2, sb.b.Bytes(), 0o640)
	if _, err := OpenSpool(p2); err == nil {
		t.Fatal("a corrupt chunk header was accepted")
	}
}
