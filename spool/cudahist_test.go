package spool

import (
	"fmt"
	"slices"
	"strings"

	"encoding/binary"
	"msmemscope/format"
	"msmemscope/trace"
	"os"
	"path/filepath"
	"testing"
)

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
		b := make([]byte, historyEntry)
		b[0], b[1] = action, dev
		binary.LittleEndian.PutUint64(b[8:], ns)
		binary.LittleEndian.PutUint64(b[16:], addr)
		binary.LittleEndian.PutUint64(b[24:], size)
		binary.LittleEndian.PutUint64(b[32:], 7)
		return b
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
// the segment_alloc waits for the HAL MALLOC at its address and of its size,
// so the blocks allocated in it come after it, their rows at its time, and
// the HAL block is PyTorch's. A segment_alloc whose MALLOC never comes waits
// histWait at most.
func TestHistoryWaitsForItsSegmentsDriverCall(t *testing.T) {
	const seg, lost = 0x7f0000000000, 0x7e0000000000
	dev0 := uint64(1) << format.DevBDevShift
	sb := newSpoolBuilder(7)
	sb.chunk(5, calib(1000, 1),
		rec{ts: 1500, a: 0x1000, b: 64, kind: format.RMalloc, flags: format.FHost},
		rec{ts: 2000, a: seg, b: 2<<20 | dev0, kind: format.RMalloc, flags: format.FHal},
		rec{ts: 3000, a: 0x2000, b: 32, kind: format.RMalloc, flags: format.FHost},
		rec{ts: 20_000, a: 0x3000, b: 16, kind: format.RMalloc, flags: format.FHost},
		rec{ts: 10_000_000, a: 0x4000, b: 8, kind: format.RMalloc, flags: format.FHost},
	)
	_, capDir := captureFolder(t, sb)
	ent := func(action uint8, ns, addr, size uint64) []byte {
		b := make([]byte, historyEntry)
		b[0] = action
		binary.LittleEndian.PutUint64(b[8:], ns)
		binary.LittleEndian.PutUint64(b[16:], addr)
		binary.LittleEndian.PutUint64(b[24:], size)
		return b
	}
	h := append([]byte{}, historyMagic...)
	for _, e := range [][]byte{
		ent(histSegAlloc, 1200, seg, 2<<20), // 800 ns before its cuMemAlloc's row
		ent(histAlloc, 1200, seg, 512),
		ent(histAlloc, 2500, seg+512, 1024),
		ent(histSegAlloc, 10_000, lost, 4<<20), // a segment whose driver call has no row
		ent(histAlloc, 10_000, lost, 256),
		ent(histFree, 4_000_000, seg, 512),
	} {
		h = append(h, e...)
	}
	if err := os.WriteFile(filepath.Join(capDir, SpoolDir, HistoryFile), h, 0o640); err != nil {
		t.Fatal(err)
	}
	in, err := Open(capDir, trace.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var got []string
	for _, e := range readInput(t, in) {
		got = append(got, fmt.Sprintf("%d %s %s %s %x", e.Timestamp, e.Kind, e.Type, e.Owner, e.Ptr))
	}
	want := []string{
		"1500 MALLOC HOST HOST 1000",
		"2000 MALLOC HAL HAL@pytorch 7f0000000000",
		"2000 MALLOC PTA PTA 7f0000000000", // (its entry: 1200)
		"2500 MALLOC PTA PTA 7f0000000200",
		"3000 MALLOC HOST HOST 2000",
		"20000 MALLOC HOST HOST 3000",
		"20000 MALLOC PTA PTA 7e0000000000", // waited for a row that never came, until 5,010,000
		"4000000 FREE PTA  7f0000000000",
		"10000000 MALLOC HOST HOST 4000",
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
