package spool

import (
	"encoding/binary"
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
