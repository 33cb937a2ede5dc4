package leakscan

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"testing"

	"msmemscope/format"
	"msmemscope/internal/spooltest"
	"msmemscope/internal/u64map"
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

// Threads that free each other's blocks, reuse addresses and fail reallocs,
// their chunks read in an order that keeps each thread's own but not time's
// across threads: the blocks found live are those the program left, each
// with its latest MALLOC's size and place among the MALLOCs read, however
// the thread's MALLOC/FREE pairs fall. With one thread, stamps also repeat
// (an epoch's compact records share its start tick).
func TestLiveHeldPairsFindTheBlocksLeft(t *testing.T) {
	for seed := int64(1); seed <= 60; seed++ {
		rng := rand.New(rand.NewSource(seed))
		threads, ties := 4, false
		if seed%3 == 0 {
			threads, ties = 1, true
		}
		type where struct{ th, i int } // a record: its thread and place
		perThread := make([][]spool.Rec, threads)
		block := map[uint64]where{} // a live address: the MALLOC that made its block
		owner := map[uint64]int{}   // who holds a live block (frees it, or hands it on)
		addrs := 8 + rng.Intn(6000) // few: reuse, and pend slots shared
		ts := uint64(1000)
		for i := 0; i < 20000; i++ {
			if !ties || rng.Intn(50) == 0 {
				ts += 1 + uint64(rng.Intn(5))
			}
			a := uint64(0x10000 + 16*rng.Intn(addrs))
			th := rng.Intn(threads)
			if _, live := block[a]; !live {
				perThread[th] = append(perThread[th], host(format.RMalloc, ts, a, uint64(1+rng.Intn(4096))))
				block[a], owner[a] = where{th, len(perThread[th]) - 1}, th
				continue
			}
			if rng.Intn(3) == 0 {
				th = owner[a] // its allocating thread frees it, or another
			}
			perThread[th] = append(perThread[th], host(format.RFree, ts, a, 0))
			if rng.Intn(50) == 0 { // a failed realloc: freed, then back at its size
				undo := host(format.RMalloc, ts, a, 0)
				undo.Flags |= format.FUndo
				perThread[th] = append(perThread[th], undo)
				owner[a] = th
				continue
			}
			delete(block, a)
		}
		// Chunks of 1..300 records, each thread's in its order, threads
		// interleaved at random; N counts the MALLOCs in that order.
		var b bytes.Buffer
		if err := spool.WriteHeader(&b, 7); err != nil {
			t.Fatal(err)
		}
		nOf := map[where]uint64{}
		var n uint64
		next := make([]int, threads)
		for {
			var left []int
			for th := range threads {
				if next[th] < len(perThread[th]) {
					left = append(left, th)
				}
			}
			if len(left) == 0 {
				break
			}
			th := left[rng.Intn(len(left))]
			end := min(len(perThread[th]), next[th]+1+rng.Intn(300))
			for i := next[th]; i < end; i++ {
				if perThread[th][i].Kind == format.RMalloc {
					n++
					nOf[where{th, i}] = n
				}
			}
			b.Write(spooltest.Chunk(int32(th+1), perThread[th][next[th]:end]...))
			next[th] = end
		}
		path := filepath.Join(t.TempDir(), "spool.bin")
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := LiveFromSpool(path)
		if err != nil {
			t.Fatal(err)
		}
		var want []Block
		for a, w := range block {
			want = append(want, Block{Addr: a, Size: perThread[w.th][w.i].B, N: nOf[w]})
		}
		sort.Slice(want, func(i, j int) bool { return want[i].Addr < want[j].Addr })
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d: %d blocks live, want %d; first difference at %v", seed, len(got), len(want), firstDiff(got, want))
		}
	}
}

func firstDiff(a, b []Block) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("%d: %+v vs %+v", i, a[i], b[i])
		}
	}
	return "the end of the shorter"
}

// A held MALLOC may be counted after one read later (a failed realloc's
// brings it back): among equal stamps the block is still the one read last.
func TestLiveCountKeepsTheLastReadAmongEqualStamps(t *testing.T) {
	l := &Live{lives: u64map.Map[addrLife]{Runs: true, Grain: 4}}
	l.count(pending{addr: 0x40, t: 5, n: 7, size: 20})
	l.count(pending{addr: 0x40, t: 5, n: 3, size: 10})
	l.lives.Slot(0x40).frees++
	if got := l.Blocks(); len(got) != 1 || got[0].Size != 20 || got[0].N != 7 {
		t.Fatalf("%v, want the block of size 20 read 7th", got)
	}
}
