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

// refLive is Live's count before MALLOCs were held back (every record in
// the map): the reference the held-back pairs must agree with.
type refLive struct {
	lives map[uint64]*addrLife
	n     uint64
}

func (r *refLive) observe(rec *spool.Rec) {
	a := r.lives[rec.A]
	if a == nil {
		a = &addrLife{}
		r.lives[rec.A] = a
	}
	if rec.Kind == format.RFree {
		a.frees++
		return
	}
	a.mallocs++
	r.n++
	if rec.Flags&format.FUndo == 0 && (a.mallocs == 1 || rec.TS >= a.lastM) {
		a.lastM, a.size, a.n = rec.TS, rec.B, r.n
	}
}

// Threads that free each other's blocks, reuse addresses and fail reallocs,
// their chunks read in an order that keeps each thread's own but not time's
// across threads: the blocks found live are those every record counted
// gives, sizes and MALLOC order included, however the pairs fall.
func TestLiveHeldPairsAsEveryRecordCounted(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewSource(seed))
		const threads = 4
		perThread := make([][]spool.Rec, threads)
		live := map[uint64]bool{}
		owner := map[uint64]int{}   // who holds a live block (frees it, or hands it on)
		addrs := 8 + rng.Intn(6000) // few: reuse, and pend slots shared
		ts := uint64(1000)
		for i := 0; i < 20000; i++ {
			ts += 1 + uint64(rng.Intn(5))
			a := uint64(0x10000 + 16*rng.Intn(addrs))
			th := rng.Intn(threads)
			if !live[a] {
				perThread[th] = append(perThread[th], host(format.RMalloc, ts, a, uint64(1+rng.Intn(4096))))
				live[a], owner[a] = true, th
				continue
			}
			if rng.Intn(3) == 0 {
				th = owner[a] // its allocating thread frees it, or another
			}
			perThread[th] = append(perThread[th], host(format.RFree, ts, a, 0))
			if rng.Intn(50) == 0 { // a failed realloc: freed, then back at its size
				ts++
				undo := host(format.RMalloc, ts, a, 0)
				undo.Flags |= format.FUndo
				perThread[th] = append(perThread[th], undo)
				owner[a] = th
				continue
			}
			live[a] = false
		}
		// Chunks of 1..300 records, each thread's in its order, threads
		// interleaved at random.
		var b bytes.Buffer
		if err := spool.WriteHeader(&b, 7); err != nil {
			t.Fatal(err)
		}
		ref := &refLive{lives: map[uint64]*addrLife{}}
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
			recs := perThread[th][next[th]:end]
			next[th] = end
			b.Write(spooltest.Chunk(int32(th+1), recs...))
			for i := range recs {
				ref.observe(&recs[i])
			}
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
		for a, l := range ref.lives {
			if l.live() {
				want = append(want, Block{Addr: a, Size: l.size, N: l.n})
			}
		}
		sort.Slice(want, func(i, j int) bool { return want[i].Addr < want[j].Addr })
		nLive := 0
		for _, v := range live {
			if v {
				nLive++
			}
		}
		if len(want) != nLive {
			t.Fatalf("seed %d: the reference finds %d live, the program left %d", seed, len(want), nLive)
		}
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
