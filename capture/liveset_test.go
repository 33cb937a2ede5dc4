package capture

// The rotator's live set against what the program holds: sweeps, hand-overs
// between threads, failed reallocs.

import (
	"bytes"
	"fmt"
	"math/rand"
	"testing"

	"msmemscope/format"
	"msmemscope/spool"
)

// handedX is the block the hand-over tests pass from thread 7 to thread 8.
const handedX = 0x7f0000001000

// handOver writes thread 8's FREE of handedX (thread 7's block, its MALLOC
// at tick+1 not yet drained) and its MALLOC of the same address (200 bytes,
// kept), and returns the tick of thread 7's MALLOC.
func handOver(t *testing.T, r *Rotator, tick uint64) uint64 {
	t.Helper()
	if err := r.Write(append(calibRec(tick+10, 1), chunkOf(8, [][4]uint64{{tick + 2, handedX, 0, format.RFree}, {tick + 3, handedX, 200, format.RMalloc}})...)); err != nil {
		t.Fatal(err)
	}
	return tick + 1
}

// pairedRecs is n MALLOC and FREE pairs of fresh addresses from base on,
// stamped after *tick (advanced).
func pairedRecs(base uint64, n int, tick *uint64) [][4]uint64 {
	recs := make([][4]uint64, 0, 2*n)
	for i := 0; i < n; i++ {
		*tick += 2
		p := base + uint64(i)*64
		recs = append(recs, [4]uint64{*tick, p, 48, format.RMalloc}, [4]uint64{*tick + 1, p, 0, format.RFree})
	}
	return recs
}

// Thread 7 mallocs X (its record lags), hands X to thread 8, which frees X
// and mallocs X again (tcache reuse) and keeps it. Thread 8's two records
// arrive first; a sweep runs; then thread 7's MALLOC arrives: X is live as
// thread 8's MALLOC made it (a sweep that forgot X, its balance 0, took
// thread 7's for it).
func TestRotatorSweepKeepsTheLiveBlocksMalloc(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 64)
	defer r.Close()
	const X = handedX
	tick := uint64(1_000_000)
	t0 := handOver(t, r, tick)
	tick += 100
	// The table fills up and sweeps (thread 9's pairs of fresh addresses).
	recs := pairedRecs(0x20000000, 70000, &tick)
	if err := r.Write(append(calibRec(tick, 2), chunkOf(9, recs)...)); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.live.find(spool.MakeKey(format.FHost, X)); ok {
		t.Log("X still held: no sweep happened")
	}
	if err := r.Write(append(calibRec(tick+10, 3), chunkOf(7, [][4]uint64{{t0, X, 100, format.RMalloc}})...)); err != nil {
		t.Fatal(err)
	}
	for _, b := range r.LiveHost() {
		if b.Addr == X && b.Size != 200 {
			t.Errorf("X live with size %d (thread 7's freed block), want 200 (thread 8's block)", b.Size)
		}
	}
}

// Several threads share a LIFO heap, hand blocks to each other, and their
// records arrive at random per-thread lags, in program order: the live set
// the rotator keeps (sweeps with logs of 64 MiB, cuts too with 1 MiB) is
// the truth's, each block with its own size.
func TestRotatorLiveSetAgainstTheTruth(t *testing.T) {
	for _, mb := range []int{64, 1} {
		for seed := int64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("mb%d/seed%d", mb, seed), func(t *testing.T) { liveSetAgainstTheTruth(t, seed, mb) })
		}
	}
}

func liveSetAgainstTheTruth(t *testing.T, seed int64, mb int) {
	rng := rand.New(rand.NewSource(seed))
	r := testRotator(t, t.TempDir(), 1000, mb)
	defer r.Close()
	const nth = 4
	tick := uint64(1_000_000)
	var freeStack []uint64
	next := uint64(0x10000000)
	held := make([][]uint64, nth)
	size := map[uint64]uint64{} // truth: live address -> size
	queue := make([][][4]uint64, nth)
	epoch := uint64(1)
	deliver := func(all bool) {
		b := calibRec(tick, epoch)
		epoch++
		for th := 0; th < nth; th++ {
			n := len(queue[th])
			if !all {
				switch rng.Intn(4) {
				case 0:
					n = 0 // this thread lags a pass
				case 1:
					n = rng.Intn(n + 1)
				}
			}
			if n == 0 {
				continue
			}
			b = append(b, chunkOf(int32(7+th), queue[th][:n])...)
			queue[th] = queue[th][n:]
		}
		if err := r.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	for step := 0; step < 400; step++ {
		for k := 0; k < 3000; k++ {
			th := rng.Intn(nth)
			tick += 3
			switch op := rng.Intn(10); {
			case op < 5 || len(held[th]) == 0: // malloc
				var p uint64
				if len(freeStack) > 0 && rng.Intn(3) > 0 {
					p = freeStack[len(freeStack)-1]
					freeStack = freeStack[:len(freeStack)-1]
				} else {
					p = next
					next += 64
				}
				sz := uint64(16 + rng.Intn(1000))
				size[p] = sz
				queue[th] = append(queue[th], [4]uint64{tick, p, sz, format.RMalloc})
				// hand it on, often
				to := th
				if rng.Intn(2) == 0 {
					to = rng.Intn(nth)
				}
				held[to] = append(held[to], p)
			case op < 9: // free the newest block held (mostly just handed)
				h := held[th]
				j := len(h) - 1
				if rng.Intn(4) == 0 {
					j = rng.Intn(len(h))
				}
				p := h[j]
				held[th] = append(h[:j], h[j+1:]...)
				delete(size, p)
				freeStack = append(freeStack, p)
				queue[th] = append(queue[th], [4]uint64{tick, p, 0, format.RFree})
			default:
			}
		}
		deliver(false)
	}
	for i := 0; i < 3; i++ {
		deliver(true)
	}
	got := map[uint64]uint64{}
	for _, b := range r.LiveHost() {
		got[b.Addr] = b.Size
	}
	wrongSize, missing, extra := 0, 0, 0
	for p, s := range size {
		g, ok := got[p]
		if !ok {
			missing++
		} else if g != s {
			wrongSize++
		}
	}
	for p := range got {
		if _, ok := size[p]; !ok {
			extra++
		}
	}
	t.Logf("truth %d live, LiveHost %d; missing %d, extra %d, wrong size %d; logs %d, late %d, table %d",
		len(size), len(got), missing, extra, wrongSize, r.seq, r.Late, r.live.idx.Len())
	if missing+extra+wrongSize > 0 {
		t.Errorf("LiveHost differs from the truth: missing %d, extra %d, wrong size %d", missing, extra, wrongSize)
	}
}

// A failed realloc: the FREE of X, then its MALLOC flagged FUndo: X lives
// on (the rotator skipped the undo, and X read as freed).
func TestRotatorFailedReallocLeavesItsBlockLive(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 64)
	defer r.Close()
	const X = 0x7f0000002000
	var body []byte
	body = spool.AppendRec(body, &spool.Rec{TS: 1_000_001, A: X, B: 64, Kind: format.RMalloc, Flags: format.FHost})
	body = spool.AppendRec(body, &spool.Rec{TS: 1_000_002, A: X, B: 0, Kind: format.RFree, Flags: format.FHost})
	body = spool.AppendRec(body, &spool.Rec{TS: 1_000_003, A: X, B: 1 << 40, Kind: format.RMalloc, Flags: format.FHost | format.FUndo})
	if err := r.Write(append(calibRec(1_000_010, 1), spool.AppendChunk(nil, format.ChunkMagic, 7, body)...)); err != nil {
		t.Fatal(err)
	}
	live := r.LiveHost()
	if len(live) != 1 || live[0].Addr != X || live[0].Size != 64 {
		t.Errorf("after a failed realloc, LiveHost = %v, want X live, its 64 bytes", live)
	}
}

// The same hand-over as TestRotatorSweepKeepsTheLiveBlocksMalloc: the next
// logs inherit X as thread 8's MALLOC made it.
func TestRotatorSweepInheritsTheLiveBlocksMalloc(t *testing.T) {
	r := testRotator(t, t.TempDir(), 100, 1)
	r.storeAll = true
	const X = handedX
	tick := uint64(1_000_000)
	t0 := handOver(t, r, tick)
	tick += 100
	ep := uint64(2)
	for round := 0; round < 2; round++ { // 2 x 35000 pairs: sweeps
		recs := pairedRecs(0x20000000+uint64(round*35000)*64, 35000, &tick)
		if err := r.Write(append(calibRec(tick, ep), chunkOf(9, recs)...)); err != nil {
			t.Fatal(err)
		}
		ep++
	}
	if err := r.Write(append(calibRec(tick+10, ep), chunkOf(7, [][4]uint64{{t0, X, 100, format.RMalloc}})...)); err != nil {
		t.Fatal(err)
	}
	ep++
	for r.seq < 3 {
		tick += 600_000
		b := append(calibRec(tick, ep), chunkOf(7, pairedRecs(0x40000000, 20000, &tick))...)
		b = append(b, chunkOf(8, nil)...) // the drain's mark: thread 8 drained
		if err := r.Write(append(b, chunkOf(8, [][4]uint64{{tick + 5, 0x50000000, 0, format.RFree}})...)); err != nil {
			t.Fatal(err)
		}
		ep++
	}
	r.Close()
	files := r.Files()
	logb, err := spool.ReadLog(files[len(files)-1])
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.New(bytes.NewReader(logb), int64(len(logb)))
	if err != nil {
		t.Fatal(err)
	}
	rd := sp.Reader()
	for {
		rec, _, err := rd.Next()
		if err != nil || rec == nil {
			break
		}
		if rec.Kind == format.RMalloc && rec.A == X {
			if rec.B != 200 {
				t.Errorf("inherited X with size %d, want 200", rec.B)
			}
		}
	}
}
