package leakscan

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"msmemscope/format"
	"msmemscope/internal/spooltest"
	"msmemscope/spool"
)

func host(kind uint16, ts, addr, size uint64) spool.Rec {
	return spool.Rec{Kind: kind, Flags: format.FHost, TS: ts, A: addr, B: size}
}

// Live read as the spool grows (a chunk cut short at the end waits for its
// rest) gives the blocks a read of the whole file gives; a FREE from another
// thread counts wherever its chunk lies.
func TestLiveFollowsAGrowingSpool(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.bin")
	var hdr bytes.Buffer
	if err := spool.WriteHeader(&hdr, 7); err != nil {
		t.Fatal(err)
	}
	parts := [][]byte{
		hdr.Bytes(),
		spooltest.Chunk(2, host(format.RFree, 300, 0xA0, 0)), // drained before its MALLOC's thread
		spooltest.Chunk(1, host(format.RMalloc, 100, 0xA0, 16), host(format.RMalloc, 200, 0xB0, 32)),
		spooltest.Chunk(1, host(format.RMalloc, 400, 0xC0, 48), host(format.RFree, 500, 0xB0, 0), host(format.RMalloc, 600, 0xB0, 64)),
	}
	want := []Block{{Addr: 0xB0, Size: 64, N: 4}, {Addr: 0xC0, Size: 48, N: 3}} // N: the MALLOCs read, in order
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(parts[0])
	l, err := OpenLive(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	steps := []struct {
		write []byte
		want  int // blocks live after the Update
	}{
		{parts[1], 0},
		{parts[2][:spool.ChunkHdrSize+8], 0}, // cut inside its body: not read yet
		{parts[2][spool.ChunkHdrSize+8:], 1}, // 0xA0 freed, 0xB0 live
		{parts[3][:4], 1},                    // cut inside its header
		{parts[3][4:], 2},
	}
	for i, s := range steps {
		f.Write(s.write)
		if err := l.Update(); err != nil {
			t.Fatal(err)
		}
		if got := len(l.Blocks()); got != s.want {
			t.Fatalf("after step %d: %d blocks live %v, want %d", i, got, l.Blocks(), s.want)
		}
	}
	if got := l.Blocks(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("followed: %v, want %v", got, want)
	}
	whole, err := LiveFromSpool(path)
	if err != nil || len(whole) != 2 || whole[0] != want[0] || whole[1] != want[1] {
		t.Errorf("whole file: %v (%v), want %v", whole, err, want)
	}
}

// UpdateUntil stops between two chunks once told to (the next Update goes
// on from there); a chunk header claiming gigabytes is an error, not an
// allocation.
func TestLiveStopsAndRefusesCorruptChunks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spool.bin")
	var b bytes.Buffer
	if err := spool.WriteHeader(&b, 7); err != nil {
		t.Fatal(err)
	}
	b.Write(spooltest.Chunk(1, host(format.RMalloc, 100, 0xA0, 16)))
	b.Write(spooltest.Chunk(1, host(format.RMalloc, 200, 0xB0, 16)))
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLive(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var stop atomic.Bool
	stop.Store(true)
	if err := l.UpdateUntil(&stop); err != nil || len(l.Blocks()) != 0 || l.Offset() != spool.HdrSize {
		t.Fatalf("stopped: %v, %d blocks, offset %d", err, len(l.Blocks()), l.Offset())
	}
	if err := l.Update(); err != nil || len(l.Blocks()) != 2 {
		t.Fatalf("then: %v, %d blocks, want 2", err, len(l.Blocks()))
	}
	bad := make([]byte, spool.ChunkHdrSize)
	binary.LittleEndian.PutUint32(bad[format.ChunkMagicOff:], format.ChunkMagic)
	binary.LittleEndian.PutUint32(bad[format.ChunkNUnitOff:], 1<<30)
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.Write(bad)
	f.Close()
	if err := l.Update(); err == nil {
		t.Error("a chunk of 8 GiB was not refused")
	}
}
