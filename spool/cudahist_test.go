package spool

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/trace"
)

// histEnt is one entry of the history file, as _cuda_history.py packs it.
func histEnt(action, dev uint8, ns, addr, size, stream uint64) []byte {
	b := make([]byte, historyEntry)
	b[0], b[1] = action, dev
	binary.LittleEndian.PutUint64(b[8:], ns)
	binary.LittleEndian.PutUint64(b[16:], addr)
	binary.LittleEndian.PutUint64(b[24:], size)
	binary.LittleEndian.PutUint64(b[32:], stream)
	return b
}

// The history file as _cuda_history.py writes it: entries of several reads
// (each read's entries, then its repairs at the read's time), sorted by
// time with ties in the file's order; a part entry at the end (a write cut
// short) and a file without the magic are dropped, and a rotating capture
// reads none.
func TestReadHistory(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, SpoolDir), 0o755); err != nil {
		t.Fatal(err)
	}
	ent := func(action uint8, dev uint8, ns, addr, size uint64) []byte {
		return histEnt(action, dev, ns, addr, size, 7)
	}
	data := append([]byte{}, historyMagic...)
	data = append(data, ent(histAlloc, 0, 300, 0x1000, 512)...)
	data = append(data, ent(histFree, 1, 100, 0x2000, 1024)...)
	data = append(data, ent(histAlloc, 1, 300, 0x3000, 2048)...)
	async := append(append([]byte{}, historyMagic...), ent(histAsync, 0, 50, 0, 0)...)
	data = append(data, ent(histSegAlloc, 0, 200, 0x4000, 4096)[:20]...)
	path := filepath.Join(dir, SpoolDir, HistoryFile)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got := readHistory(dir)
	want := []histEntry{{ns: 100, addr: 0x2000, size: 1024, stream: 7, action: histFree, dev: 1},
		{ns: 300, addr: 0x1000, size: 512, stream: 7, action: histAlloc, dev: 0},
		{ns: 300, addr: 0x3000, size: 2048, stream: 7, action: histAlloc, dev: 1}}
	if len(got) != len(want) {
		t.Fatalf("got %d entries %+v, want %+v", len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if h := (&Spool{}).history(dir, true); len(h.entries) != 0 || h.asyncTorch {
		t.Errorf("a rotating capture read %+v", h)
	}
	if h := (&Spool{}).history(dir, false); len(h.entries) != 3 || h.asyncTorch {
		t.Errorf("the capture's history: %+v", h)
	}
	if err := os.WriteFile(path, async, 0o644); err != nil {
		t.Fatal(err)
	}
	if h := (&Spool{}).history(dir, false); len(h.entries) != 0 || !h.asyncTorch {
		t.Errorf("cudaMallocAsync's mark: %+v", h)
	}
	if err := os.WriteFile(path, data[len(historyMagic):], 0o644); err != nil {
		t.Fatal(err)
	}
	if h := readHistory(dir); h != nil {
		t.Errorf("a file without the magic gave %d entries", len(h))
	}
}

// A segment's history entries stamped before its driver call (PyTorch's
// clock, converted from the TSC, may run microseconds behind the records'):
// the segment_alloc waits for the HAL MALLOC at its address and of its
// size, which no earlier segment_alloc took, so the blocks allocated in it
// come after it, their rows at its time, and the HAL block is PyTorch's:
// also where a block of another size still lives at that address, or the
// segment's own predecessor of the same size (freed by PyTorch, its FREE row
// yet to come). A segment_alloc whose MALLOC never comes waits histWait at
// most.
func TestHistoryWaitsForItsSegmentsDriverCall(t *testing.T) {
	const seg, other, same, lost = 0x7f0000000000, 0x7d0000000000, 0x7c0000000000, 0x7e0000000000
	dev0 := uint64(1) << format.DevBDevShift
	hal := func(ts, addr, size uint64) rec {
		return rec{ts: ts, a: addr, b: size | dev0, kind: format.RMalloc, flags: format.FHal}
	}
	halFree := func(ts, addr uint64) rec { return rec{ts: ts, a: addr, kind: format.RFree, flags: format.FHal} }
	host := func(ts, addr uint64) rec {
		return rec{ts: ts, a: addr, b: 64, kind: format.RMalloc, flags: format.FHost}
	}
	sb := newSpoolBuilder(7)
	sb.chunk(5, calib(1000, 1), host(1500, 0x1000), hal(2000, seg, 2<<20), hal(2100, other, 1<<20),
		host(3000, 0x2000), halFree(3500, other), hal(3600, other, 2<<20),
		hal(4000, same, 2<<20), halFree(4500, same), hal(4600, same, 2<<20),
		host(20_000, 0x3000), host(1_500_000, 0x5000), host(10_000_000, 0x4000))
	_, capDir := captureFolder(t, sb)
	ent := func(action uint8, ns, addr, size uint64) []byte { return histEnt(action, 0, ns, addr, size, 0) }
	h := append([]byte{}, historyMagic...)
	for _, e := range [][]byte{
		ent(histSegAlloc, 1200, seg, 2<<20), // 800 ns before its cuMemAlloc's row
		ent(histAlloc, 1200, seg, 512),
		ent(histAlloc, 2500, seg+512, 1024),
		ent(histSegAlloc, 3300, other, 2<<20), // while another's block of 1 MiB still lives there
		ent(histAlloc, 3300, other, 128),
		ent(histSegAlloc, 4000, same, 2<<20),
		ent(histAlloc, 4100, same, 64),
		ent(histFree, 4200, same, 64),
		ent(histSegFree, 4300, same, 2<<20),
		ent(histSegAlloc, 4400, same, 2<<20), // the same address and size again, before the FREE row
		ent(histAlloc, 4400, same, 32),
		ent(histSegAlloc, 10_000, lost, 4<<20), // a segment whose driver call has no row
		ent(histAlloc, 10_000, lost, 256),
		ent(histFree, 4_000_000, seg, 512),
	} {
		h = append(h, e...)
	}
	if err := os.WriteFile(filepath.Join(capDir, SpoolDir, HistoryFile), h, 0o640); err != nil {
		t.Fatal(err)
	}
	got := captureRows(t, capDir, func(e *trace.Event) string {
		return fmt.Sprintf("%d %s %s %s %x %d", e.Timestamp, e.Kind, e.Type, e.Owner, e.Ptr, e.Size)
	})
	want := []string{
		"1500 MALLOC HOST HOST 1000 64",
		"2000 MALLOC HAL HAL@pytorch 7f0000000000 2097152",
		"2000 MALLOC PTA PTA 7f0000000000 512", // (its entry: 1200)
		"2100 MALLOC HAL HAL 7d0000000000 1048576",
		"2500 MALLOC PTA PTA 7f0000000200 1024",
		"3000 MALLOC HOST HOST 2000 64",
		"3500 FREE HAL  7d0000000000 1048576",
		"3600 MALLOC HAL HAL@pytorch 7d0000000000 2097152",
		"3600 MALLOC PTA PTA 7d0000000000 128",
		"4000 MALLOC HAL HAL@pytorch 7c0000000000 2097152",
		"4100 MALLOC PTA PTA 7c0000000000 64",
		"4200 FREE PTA  7c0000000000 64",
		"4500 FREE HAL  7c0000000000 2097152",
		"4600 MALLOC HAL HAL@pytorch 7c0000000000 2097152",
		"4600 MALLOC PTA PTA 7c0000000000 32",
		"20000 MALLOC HOST HOST 3000 64",
		"20000 MALLOC PTA PTA 7e0000000000 256", // waited for a row that never came, until 1,010,000
		"1500000 MALLOC HOST HOST 5000 64",
		"4000000 FREE PTA  7f0000000000 512",
		"10000000 MALLOC HOST HOST 4000 64",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A CUDA tensor block's alloc entry may come microseconds before the
// operator that allocated it (two clocks): the next operator to start,
// within opSkew (the edge included), owns it (PTA@aten) when it or an
// operator it calls names it as an output (a W or N line), and a category
// given meanwhile stays. These stay PyTorch's alone: one it only reads, one
// it reads and then writes (in place), one allocated earlier than opSkew,
// one an operator in between did not name, one another thread's operator
// outputs while the offered one runs, and one an operator of its thread
// outputs after it ended, while another thread's kept an operator open.
func TestTensorBlockJustBeforeItsOperator(t *testing.T) {
	const a, b, d, e, f, g, i, j, k, m = 0xa000, 0xb000, 0xd000, 0xe000, 0xf000, 0x10000, 0x11000, 0x12000, 0x13000, 0x14000
	const i2, i3 = 0x15000, 0x16000
	line := func(rw string, addr uint64) string { return fmt.Sprintf("\n%s %x %x 64 float [16] ND", rw, addr, addr) }
	op := func(kind uint16, ts, n uint64, s string) rec {
		return rec{ts: ts, a: n, b: uint64(len(s)), kind: kind, flags: format.FText, payload: []byte(s)}
	}
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1))
	sb.chunk(5,
		op(format.ROpStart, 100_000, 1, "aten::one"+line("R", b)),
		op(format.ROpEnd, 200_000, 1, "aten::one"+line("W", a)),
		op(format.ROpStart, 4_000_000, 2, "aten::two"),
		op(format.ROpEnd, 4_100_000, 2, "aten::two"+line("N", d)+line("W", e)),
		op(format.ROpStart, 5_000_000, 3, "aten::three"),
		op(format.ROpEnd, 5_010_000, 3, "aten::three"),
		op(format.ROpStart, 5_020_000, 4, "aten::four"),
		op(format.ROpEnd, 5_030_000, 4, "aten::four"+line("W", f)),
		op(format.ROpStart, 7_000_000, 5, "aten::five"),
		op(format.ROpStart, 7_001_000, 6, "aten::six"),
		op(format.ROpEnd, 7_002_000, 6, "aten::six"+line("W", g)),
		op(format.ROpEnd, 7_003_000, 5, "aten::five"),
		rec{ts: 8_000_000, a: 0x1000, b: 64, kind: format.RMalloc, flags: format.FHost},
		op(format.ROpStart, 9_000_000, 7, "aten::seven"),
		op(format.ROpEnd, 9_010_000, 7, "aten::seven"+line("W", i3)),
		op(format.ROpStart, 9_012_000, 12, "aten::twelve"), // while eight is open
		op(format.ROpEnd, 9_015_000, 12, "aten::twelve"+line("W", i)),
		op(format.ROpStart, 9_500_000, 9, "aten::add_"+line("R", j)),
		op(format.ROpEnd, 9_510_000, 9, "aten::add_"+line("W", j)),
		op(format.ROpStart, 11_000_000, 10, "aten::empty"),
		op(format.ROpEnd, 11_001_000, 10, "aten::empty"+line("N", k)),
		op(format.ROpStart, 12_000_000, 11, "aten::relu"),
		op(format.RTag, 12_000_500, m, "activation"),
		op(format.ROpEnd, 12_001_000, 11, "aten::relu"+line("W", m)))
	sb.chunk(6, // another thread's, while seven runs
		op(format.ROpStart, 9_002_000, 13, "aten::thirteen"),
		op(format.ROpEnd, 9_004_000, 13, "aten::thirteen"+line("W", i2)),
		op(format.ROpStart, 9_005_000, 8, "aten::eight"),
		op(format.ROpEnd, 9_020_000, 8, "aten::eight"))
	_, capDir := captureFolder(t, sb)
	b0, _ := json.Marshal(ProcessMeta{Pid: 7, Config: config.Default()})
	if err := os.WriteFile(filepath.Join(capDir, SpoolDir, ProcessFile), b0, 0o640); err != nil {
		t.Fatal(err)
	}
	h := append([]byte{}, historyMagic...)
	for _, x := range []struct{ ns, addr uint64 }{
		{70_000, a},     // 30 µs before operator one, its output
		{90_000, b},     // 10 µs before, only read
		{2_900_000, d},  // 1.1 ms before operator two
		{4_050_000, e},  // inside operator two
		{4_990_000, f},  // before operator three, which does not name it; four does
		{6_995_000, g},  // before operator five, whose inner six names it
		{8_999_000, i},  // before seven, which does not name it; twelve, after it, does
		{8_999_500, i2}, // before seven; thirteen, on another thread, names it
		{8_999_800, i3}, // before seven, which names it after thirteen started
		{9_499_000, j},  // before add_, which reads it, then writes it
		{10_000_000, k}, // opSkew before empty
		{11_999_000, m}, // before relu, which tags it an activation, then outputs it
	} {
		h = append(h, histEnt(histAlloc, 0, x.ns, x.addr, 64, 0)...)
	}
	if err := os.WriteFile(filepath.Join(capDir, SpoolDir, HistoryFile), h, 0o640); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	captureRows(t, capDir, func(ev *trace.Event) string {
		if ev.Kind == trace.KindMalloc && ev.Type == trace.TypePTA {
			got[fmt.Sprintf("%x", ev.Ptr)] = ev.Owner
		}
		return ""
	})
	want := map[string]string{"a000": "PTA@aten", "b000": "PTA", "d000": "PTA", "e000": "PTA@aten", "f000": "PTA", "10000": "PTA@aten",
		"11000": "PTA", "15000": "PTA", "16000": "PTA@aten", "12000": "PTA", "13000": "PTA@aten", "14000": "PTA@activation"}
	if !maps.Equal(got, want) {
		t.Errorf("owners %v, want %v", got, want)
	}
}
