package capture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"msmemscope/format"
	"msmemscope/internal/spooltest"
	"msmemscope/spool"
)

// chunkOf builds one drained chunk (spool chunk format) of full records.
func chunkOf(tid int32, recs [][4]uint64) []byte {
	var body []byte
	for _, r := range recs {
		body = spool.AppendRec(body, &spool.Rec{TS: r[0], A: r[1], B: r[2], Kind: uint16(r[3]), Flags: format.FHost})
	}
	return spool.AppendChunk(nil, format.ChunkMagic, tid, body)
}

// logMB is the tests' log size: 1 MiB, 4 stored (a log grows while its cut
// settles, 50 ms: at the tests' event rate, 1.6 MB stored; past their
// bound together, the oldest logs would go early).
func logMB(stored bool) int {
	if stored {
		return 4
	}
	return 1
}

// testRotator is NewRotator for process 42, the test failed if it fails.
func testRotator(t testing.TB, dir string, maxFiles, maxMB int) *Rotator {
	t.Helper()
	r, err := NewRotator(dir, 42, maxFiles, maxMB)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// threadRecs is one thread's records in a batch.
type threadRecs struct {
	tid  int32
	recs [][4]uint64
}

// writeBatch writes a drain's batch: calib, then each thread's records;
// small: in Writes of 1000 records at most (the batches a log of 1 MiB
// stores are a sixteenth of it).
func writeBatch(r *Rotator, calib []byte, small bool, parts ...threadRecs) error {
	b := calib
	for _, p := range parts {
		for len(p.recs) > 0 {
			n := len(p.recs)
			if small {
				n = min(n, 1000)
			}
			b = append(b, chunkOf(p.tid, p.recs[:n])...)
			p.recs = p.recs[n:]
			if small {
				if err := r.Write(b); err != nil {
					return err
				}
				b = nil
			}
		}
	}
	if len(b) == 0 {
		return nil
	}
	return r.Write(b)
}

// eachLogRec reads the log at path alone and hands f its records in order.
func eachLogRec(t *testing.T, path string, f func(rec *spool.Rec, ns uint64)) {
	t.Helper()
	b, err := spool.ReadLog(path)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.New(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("%s does not parse alone: %v", path, err)
	}
	spooltest.Each(t, sp, f)
}

// calibRec is a drain pass's calibration: tick, and 100 ns a tick (the
// rotator waits rotateLagNs of them before a new log's prologue settles).
func calibRec(tick, epoch uint64) []byte {
	body := spool.AppendRec(nil, &spool.Rec{TS: tick, A: tick * 100, B: epoch, Kind: format.RCalib, Flags: format.FEpoch})
	return spool.AppendChunk(nil, format.ChunkMagic, 0, body)
}

// The run: 40 drains of 60 000 events each; every drain allocates 30 000
// blocks and frees 30 000, keeping every 1000th block alive for good.
// Batches as large as a program recording flat out gives are stored (raw
// zstd blocks, read the same), smaller ones compressed.
func TestRotatorKeepsNSelfContainedFiles(t *testing.T) {
	t.Run("compressed", func(t *testing.T) { keepsNSelfContainedFiles(t, false) })
	t.Run("stored", func(t *testing.T) { keepsNSelfContainedFiles(t, true) })
}

func keepsNSelfContainedFiles(t *testing.T, stored bool) {
	dir := t.TempDir()
	r := testRotator(t, dir, 3, logMB(stored))
	r.storeAll = stored
	rng := rand.New(rand.NewSource(1))
	kept := map[uint64]bool{}
	tick := uint64(1_000_000)
	var lastPtr uint64
	for d := 0; d < 40; d++ {
		var recs [][4]uint64
		for i := 0; i < 30000; i++ {
			ptr := 0x10000000 + uint64(d)*0x1000000 + uint64(i)*64 + uint64(rng.Intn(8))*8
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, uint64(16 + rng.Intn(500)), format.RMalloc})
			if i%1000 == 0 {
				kept[ptr] = true
				continue
			}
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, 0, format.RFree})
		}
		lastPtr = recs[len(recs)-1][1]
		if err := writeBatch(r, calibRec(tick, uint64(d+1)), stored, threadRecs{7, recs}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, spool.LogPrefix+"*"+spool.LogSuffix))
	if len(files) != 3 {
		t.Fatalf("%d logs kept, want 3: %v", len(files), files)
	}
	if r.seq <= 3 {
		t.Fatalf("only %d logs were ever written: the test did not rotate", r.seq)
	}
	for i, f := range files {
		// Replay: every FREE must find its block (inherited or allocated here).
		live := map[uint64]bool{}
		inherited := 0
		var last uint64
		eachLogRec(t, f, func(rec *spool.Rec, _ uint64) {
			switch rec.Kind {
			case format.RMalloc:
				live[rec.A] = true
				if rec.Flags&format.FInherit != 0 {
					inherited++
				}
				last = rec.A
			case format.RFree:
				if !live[rec.A] {
					t.Fatalf("%s: FREE of %#x without its block", f, rec.A)
				}
				delete(live, rec.A)
				last = rec.A
			}
		})
		if inherited == 0 {
			t.Errorf("%s inherits no live blocks", f)
		}
		if i == len(files)-1 {
			if last != lastPtr {
				t.Errorf("the newest log ends at %#x, the run at %#x", last, lastPtr)
			}
			// Parsed alone, the newest log knows exactly the blocks still live.
			if len(live) != len(kept) {
				t.Errorf("newest log: %d live blocks at the end, want %d", len(live), len(kept))
			}
			for p := range kept {
				if !live[p] {
					t.Errorf("newest log lost kept block %#x", p)
					break
				}
			}
		}
	}
	if !stored && (r.RawBytes == 0 || r.Written == 0 || r.Written >= r.RawBytes/4) {
		t.Errorf("compression: %d raw bytes -> %d written", r.RawBytes, r.Written)
	}
	if stored && r.Written < r.RawBytes {
		t.Errorf("stored: %d raw bytes -> %d written", r.RawBytes, r.Written)
	}
}

// A thread's compact records can continue, in the next log, an epoch it
// entered in the previous one: the new log restates the thread's epoch.
func TestRotatorRestatesThreadEpochs(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 1)
	compact := func(ptr uint64) []byte { // a compact FREE (format/records.def)
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], ptr|1<<63|1<<62|uint64(format.FHost)<<48)
		return b[:]
	}
	thread := func(tid int32, body []byte) []byte {
		return spool.AppendChunk(nil, format.ChunkMagic, tid, body)
	}
	first := spool.AppendRec(nil, &spool.Rec{Kind: format.REpoch, TS: spool.TSEpoch | 1})
	first = spool.AppendRec(first, &spool.Rec{Kind: format.RMalloc, TS: 1500, A: 0x100, B: 8, Flags: format.FHost})
	first = spool.AppendRec(first, &spool.Rec{Kind: format.RMalloc, TS: 1600, A: 0x200, B: 8, Flags: format.FHost})
	if err := r.Write(append(append(calibRec(1000, 1), calibRec(5000, 2)...), thread(7, first)...)); err != nil {
		t.Fatal(err)
	}
	r.cur.bytes = r.maxBytes // rotate at the next batch
	// Past the cut (a precise MALLOC at 2000), the thread's compact FREEs
	// are still in epoch 1.
	second := spool.AppendRec(nil, &spool.Rec{Kind: format.RMalloc, TS: 2000, A: 0x300, B: 8, Flags: format.FHost})
	if err := r.Write(thread(7, append(second, append(compact(0x100), compact(0x200)...)...))); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if len(r.Files()) != 2 {
		t.Fatalf("%d logs, want 2", len(r.Files()))
	}
	frees := 0
	eachLogRec(t, r.Files()[1], func(rec *spool.Rec, ns uint64) {
		if rec.Kind == format.RFree {
			frees++
			if rec.TS != spool.TSEpoch|1 || ns < 100000 || ns >= 500000 {
				t.Errorf("FREE of %#x: stamp %#x at %d ns, want epoch 1 (100000..500000 ns)", rec.A, rec.TS, ns)
			}
		}
	})
	if frees != 2 {
		t.Fatalf("%d FREEs read from the second log, want 2", frees)
	}
}

// A stamp unit at the end of a batch stamps the thread's first event in
// the next one: the rotator keeps a copy of it (the drain reuses the
// batch's buffer), and the log gets it before that event.
func TestRotatorStampAcrossBatches(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 1)
	const stamp = 2345
	var unit [8]byte // a stamp unit (format/records.def's P_STAMP)
	binary.LittleEndian.PutUint64(unit[:], format.PairBits|format.PairStamp|stamp)
	first := spool.AppendRec(nil, &spool.Rec{Kind: format.REpoch, TS: spool.TSEpoch | 1})
	first = spool.AppendRec(first, &spool.Rec{Kind: format.RMalloc, TS: 1500, A: 0x100, B: 8, Flags: format.FHost})
	batch := append(calibRec(1000, 1), spool.AppendChunk(nil, format.ChunkMagic, 7, append(first, unit[:]...))...)
	if err := r.Write(batch); err != nil {
		t.Fatal(err)
	}
	for i := range batch {
		batch[i] = 0xa5 // the drain's next pass
	}
	var free [8]byte // a compact FREE of 0x100, in the thread's epoch
	binary.LittleEndian.PutUint64(free[:], 0x100|format.CompactBit|format.CompactFree|uint64(format.FHost)<<48)
	if err := r.Write(spool.AppendChunk(nil, format.ChunkMagic, 7, free[:])); err != nil {
		t.Fatal(err)
	}
	r.Close()
	frees := 0
	eachLogRec(t, r.Files()[0], func(rec *spool.Rec, ns uint64) {
		if rec.Kind == format.RFree {
			if frees++; rec.A != 0x100 || rec.TS != stamp {
				t.Errorf("FREE of %#x stamped %#x, want %#x at %#x", rec.A, rec.TS, 0x100, stamp)
			}
		}
	})
	if frees != 1 {
		t.Fatalf("%d FREEs read, want 1", frees)
	}
}

// Events recorded before rotation began may need their thread's past (a
// pair unit's distances from the last address): the log gets them as full
// records, so that it reads alone with the right addresses.
func TestRotatorWritesPairsWhole(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 1)
	unit := func(w uint64) []byte { return binary.LittleEndian.AppendUint64(nil, w) }
	body := spool.AppendRec(nil, &spool.Rec{Kind: format.REpoch, TS: spool.TSEpoch | 1})
	body = append(body, unit(0x7f0000001000|1<<63|uint64(format.FHost)<<48)...) // a compact MALLOC
	body = append(body, unit(64|uint64(3)<<48)...)
	// A pair unit: FREE at the last address, then FREE 0x40 below it.
	d := int64(-0x40)
	body = append(body, unit(7<<61|1<<31|uint64(d>>4)&(1<<28-1))...)
	if err := r.Write(append(calibRec(1000, 1), spool.AppendChunk(nil, format.ChunkMagic, 7, body)...)); err != nil {
		t.Fatal(err)
	}
	r.Close()
	raw, err := spool.ReadLog(r.Files()[0])
	if err != nil {
		t.Fatal(err)
	}
	for off := spool.HdrSize; off < len(raw); {
		n := int(binary.LittleEndian.Uint32(raw[off+4:]))
		for p := off + spool.ChunkHdrSize; p < off+spool.ChunkHdrSize+n*spool.UnitSize; p += spool.UnitSize {
			if w := binary.LittleEndian.Uint64(raw[p:]); w>>61 == 7 {
				t.Fatal("a pair unit went to the log as it was")
			}
		}
		off += spool.ChunkHdrSize + n*spool.UnitSize
	}
	var frees []uint64
	eachLogRec(t, r.Files()[0], func(rec *spool.Rec, _ uint64) {
		if rec.Kind == format.RFree {
			frees = append(frees, rec.A)
		}
	})
	if len(frees) != 2 || frees[0] != 0x7f0000001000 || frees[1] != 0x7f0000000fc0 {
		t.Fatalf("FREEs %x, want [7f0000001000 7f0000000fc0]", frees)
	}
}

// Two threads, one freeing the blocks the other allocates, the allocating
// one drained two batches late (its MALLOCs come after their FREEs): each log
// read alone pairs every FREE with its block, and the newest one ends with
// the blocks truly live.
func TestRotatorLaggingThread(t *testing.T) {
	dir := t.TempDir()
	r := testRotator(t, dir, 3, 1)
	tick := uint64(1_000_000)
	rng := rand.New(rand.NewSource(2))
	var lagging [][][4]uint64 // thread 7's records of the batches not drained yet
	live := map[uint64]bool{}
	for d := 0; d < 60; d++ {
		var mallocs, frees [][4]uint64
		for i := 0; i < 20000; i++ {
			ptr := 0x10000000 + uint64(rng.Intn(4096))*64 // addresses reused batch after batch
			tick += 10 + uint64(rng.Intn(10))
			if live[ptr] {
				frees = append(frees, [4]uint64{tick, ptr, 0, format.RFree})
				delete(live, ptr)
			} else {
				mallocs = append(mallocs, [4]uint64{tick, ptr, uint64(16 + rng.Intn(500)), format.RMalloc})
				live[ptr] = true
			}
		}
		// Thread 8's frees of this batch, thread 7's mallocs of two before.
		b := append(calibRec(tick, uint64(d+1)), chunkOf(8, frees)...)
		if lagging = append(lagging, mallocs); len(lagging) > 2 {
			b = append(b, chunkOf(7, lagging[0])...)
			lagging = lagging[1:]
		}
		if err := r.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range lagging {
		if err := r.Write(chunkOf(7, m)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r.seq <= 3 || r.Late != 0 {
		t.Fatalf("%d logs written, %d late records: want more than 3 and none late", r.seq, r.Late)
	}
	files := r.Files()
	for i, f := range files {
		held := map[uint64]bool{}
		eachLogRec(t, f, func(rec *spool.Rec, _ uint64) {
			switch rec.Kind {
			case format.RMalloc:
				if held[rec.A] {
					t.Fatalf("%s: MALLOC of %#x, held already", f, rec.A)
				}
				held[rec.A] = true
			case format.RFree:
				if !held[rec.A] {
					t.Fatalf("%s: FREE of %#x without its block", f, rec.A)
				}
				delete(held, rec.A)
			}
		})
		if i == len(files)-1 && len(held) != len(live) {
			t.Errorf("newest log: %d blocks live at its end, want %d", len(held), len(live))
		}
	}
}

// A block freed by another thread at once: the FREE's stamp can read up to
// an unfenced TSC read's jitter before its MALLOC's (seen in tests/progs/
// pool.c under load). The rotator must take the allocator's word (MALLOCs
// and FREEs alternate on an address), not the stamps', for the blocks a log
// inherits: each log read alone ends with exactly the blocks live.
func TestRotatorFreeStampedBeforeItsMalloc(t *testing.T) {
	dir := t.TempDir()
	r := testRotator(t, dir, 3, 1)
	tick := uint64(1_000_000)
	rng := rand.New(rand.NewSource(3))
	live := map[uint64]bool{}
	for d := 0; d < 60; d++ {
		var mallocs, frees [][4]uint64
		for i := 0; i < 20000; i++ {
			ptr := 0x10000000 + uint64(rng.Intn(4096))*64
			if live[ptr] {
				continue // kept for good
			}
			tick += 400
			mallocs = append(mallocs, [4]uint64{tick, ptr, uint64(16 + rng.Intn(500)), format.RMalloc})
			if i%5000 == 4999 {
				live[ptr] = true
				continue
			}
			frees = append(frees, [4]uint64{tick - 1 - uint64(rng.Intn(5)), ptr, 0, format.RFree})
		}
		b := append(calibRec(tick, uint64(d+1)), chunkOf(7, mallocs)...)
		b = append(b, chunkOf(8, frees)...)
		if err := r.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r.seq <= 3 {
		t.Fatalf("%d logs written, want more than 3", r.seq)
	}
	for i, f := range r.Files() {
		b, err := spool.ReadLog(f)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := spool.New(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		held := map[spool.BlockKey]bool{}
		rd := sp.Reader()
		rd.SetLive(func(k spool.BlockKey) bool { return held[k] })
		for {
			rec, _, err := rd.Next()
			if err != nil {
				t.Fatal(err)
			}
			if rec == nil {
				break
			}
			switch rec.Kind {
			case format.RMalloc:
				held[spool.KeyOf(rec)] = true
			case format.RFree:
				delete(held, spool.KeyOf(rec))
			}
		}
		if rd.Stats.UnpairedFree != 0 || rd.Stats.LostFree != 0 {
			t.Errorf("%s read alone: order %+v", filepath.Base(f), rd.Stats)
		}
		if i == len(r.Files())-1 && len(held) != len(live) {
			t.Errorf("newest log: %d blocks live at its end, want %d", len(held), len(live))
		}
	}
}

// A block inherited by a later log is its MALLOC whole: size, site, flags
// and payload, one unit (a stack's id) or longer (an inline stack); and
// addresses freed long ago are forgotten, their places reused.
func TestRotatorInheritsMallocsWhole(t *testing.T) {
	r := testRotator(t, t.TempDir(), 4, 1)
	payload := func(n, seed int) []byte {
		b := make([]byte, 8*n)
		for i := range b {
			b[i] = byte(seed*7 + i)
		}
		return b
	}
	kept := map[uint64]spool.Rec{}
	tick := uint64(1_000_000)
	for d := 0; d < 12; d++ {
		var body []byte
		for i := 0; i < 3000; i++ {
			ptr := 0x20000000 + uint64(d)*0x100000 + uint64(i)*32
			tick += 10
			rec := spool.Rec{Kind: format.RMalloc, TS: tick, A: ptr, B: uint64(24 + i%100), Flags: format.FHost, Site: uint32(1 + i%500)}
			switch i % 3 {
			case 1:
				rec.Payload = payload(1, i)
			case 2:
				rec.Payload = payload(5, i)
			}
			body = spool.AppendRec(body, &rec)
			if i%100 == 0 {
				kept[ptr] = rec
				continue
			}
			tick += 10
			body = spool.AppendRec(body, &spool.Rec{Kind: format.RFree, TS: tick, A: ptr, Flags: format.FHost})
		}
		tick += 1_000_000 // 100 ms: a cut settles at the next batch
		if r.old == nil {
			r.cur.bytes = r.maxBytes // a new log at each batch
		}
		if err := r.Write(append(calibRec(tick, uint64(d+1)), spool.AppendChunk(nil, format.ChunkMagic, 7, body)...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	files := r.Files()
	if r.seq < 4 {
		t.Fatalf("%d logs written: the test did not rotate", r.seq)
	}
	found := 0
	eachLogRec(t, files[len(files)-1], func(rec *spool.Rec, _ uint64) {
		if rec.Kind != format.RMalloc || rec.Flags&format.FInherit == 0 {
			return
		}
		want, ok := kept[rec.A]
		if !ok {
			t.Fatalf("inherited %#x, never kept", rec.A)
		}
		found++
		if rec.B != want.B || rec.Site != want.Site || !bytes.Equal(rec.Payload, want.Payload) {
			t.Fatalf("inherited %#x: size %d site %d payload %x, want %d %d %x", rec.A, rec.B, rec.Site, rec.Payload, want.B, want.Site, want.Payload)
		}
	})
	if found == 0 || found > len(kept) {
		t.Fatalf("%d blocks inherited by the newest log, of %d kept", found, len(kept))
	}
	// What the table holds: the kept blocks, and the addresses freed since
	// the cut before last, no more (the rest forgotten, their places reused).
	if n, max := r.live.idx.Len(), len(kept)+3*3000; n < len(kept) || n > max {
		t.Errorf("%d addresses held, want %d..%d", n, len(kept), max)
	}
	if int(r.live.n) > r.live.idx.Len()+3*3000 {
		t.Errorf("%d places made for %d addresses: freed places are not reused", r.live.n, r.live.idx.Len())
	}
}

// A block whose address (a CUDA VMM handle: opaque) has bits 60-63 set is
// inherited with the address it was allocated at.
func TestRotatorInheritsHighAddress(t *testing.T) {
	r := testRotator(t, t.TempDir(), 4, 1)
	const handle = 0xF000_0000_0000_1230
	tick := uint64(1_000_000)
	for d := 0; d < 6; d++ {
		var body []byte
		if d == 0 {
			body = spool.AppendRec(body, &spool.Rec{Kind: format.RMalloc, TS: tick + 5, A: handle, B: 4096, Flags: format.FVmm})
		}
		body = spool.AppendRec(body, &spool.Rec{Kind: format.RMalloc, TS: tick + 10, A: 0x1000 + uint64(d)*16, B: 8, Flags: format.FHost})
		tick += 1_000_000
		if r.old == nil {
			r.cur.bytes = r.maxBytes
		}
		if err := r.Write(append(calibRec(tick, uint64(d+1)), spool.AppendChunk(nil, format.ChunkMagic, 7, body)...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	files := r.Files()
	found := false
	eachLogRec(t, files[len(files)-1], func(rec *spool.Rec, _ uint64) {
		if rec.Kind == format.RMalloc && rec.Flags&format.FSubMask == format.FVmm {
			found = true
			if rec.A != handle {
				t.Errorf("inherited VMM handle %#x, allocated as %#x", rec.A, uint64(handle))
			}
		}
	})
	if !found {
		t.Fatal("the handle was not inherited")
	}
}

// A full disk: the oldest log kept beside the two being written goes early,
// for the batches to come; with none left to delete, the logs take nothing
// more (errLogsFull), and what they hold stays whole.
func TestRotatorFullDisk(t *testing.T) {
	dir := t.TempDir()
	r := testRotator(t, dir, 5, 1)
	tick := uint64(1_000_000)
	rng := rand.New(rand.NewSource(2))
	batch := func(d int) error {
		var recs [][4]uint64
		for i := 0; i < 30000; i++ {
			ptr := 0x10000000 + uint64(i)*64 + uint64(rng.Intn(8))*8
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, uint64(16 + rng.Intn(500)), format.RMalloc})
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, 0, format.RFree})
		}
		return r.Write(append(calibRec(tick, uint64(d+1)), chunkOf(7, recs)...))
	}
	d := 0
	for ; len(r.Files()) < 4; d++ {
		if err := batch(d); err != nil {
			t.Fatal(err)
		}
	}
	before := r.Files()
	r.roomAfter(syscall.ENOSPC)
	if got := r.Files(); len(got) != len(before)-1 || got[0] != before[1] || r.full {
		t.Fatalf("after a full disk: logs %v (before %v), full %v; want the oldest gone", got, before, r.full)
	}
	if _, err := os.Stat(before[0]); !os.IsNotExist(err) {
		t.Errorf("the oldest log is still there: %v", err)
	}
	r.roomAfter(syscall.EFBIG)           // (not a full disk: nothing deleted)
	for i := 0; i < 10 && !r.full; i++ { // down to the logs being written, then full
		r.roomAfter(syscall.ENOSPC)
	}
	if n := len(r.Files()); !r.full || n > 2 || (r.old != nil) != (n == 2) {
		t.Fatalf("full %v with %d logs kept (a cut settling: %v)", r.full, n, r.old != nil)
	}
	if err := batch(d); !errors.Is(err, errLogsFull) {
		t.Fatalf("a batch on a full disk: %v, want errLogsFull", err)
	}
	r.Close()
	for _, f := range r.Files() {
		if _, err := spool.OpenWholeLog(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// A frame whose write fails is undone to the log's size before it, also in
// a log opened to append to (an earlier log's AHED chunks), where the file
// offset is 0 until the first write: the log was cut to nothing. (The file
// size limit fails the write: in a process of its own, as it is for the
// whole process.)
func TestAppendFrameUndone(t *testing.T) {
	if os.Getenv("APPEND_FRAME_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestAppendFrameUndone$", "-test.v")
		cmd.Env = append(os.Environ(), "APPEND_FRAME_CHILD="+t.TempDir())
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	p := filepath.Join(os.Getenv("APPEND_FRAME_CHILD"), "log_000001.zst")
	if err := os.WriteFile(p, bytes.Repeat([]byte{1}, 4096), 0o640); err != nil {
		t.Fatal(err)
	}
	signal.Ignore(syscall.SIGXFSZ)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 6000, Max: 6000}); err != nil {
		t.Skip(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := appendFrame(f, bytes.Repeat([]byte{2}, 4096)); err == nil {
		t.Fatal("a write past the file size limit did not fail")
	}
	if fi, _ := os.Stat(p); fi.Size() != 4096 {
		t.Fatalf("the log is %d bytes after the failed frame, want its 4096", fi.Size())
	}
}

// The drain's batch holds the largest record a thread writes (a Python
// code object's: 512 KiB of payload) with a pass's calibration, whatever
// the log's size: else no pass could take it, and the program would wait
// for good.
func TestBatchMaxHoldsTheLargestRecord(t *testing.T) {
	largest := 2*spool.ChunkHdrSize + 3*spool.RecSize + int(format.RecNMask)*spool.UnitSize
	for _, mb := range []int{1, 2, 20, 1000} {
		r := testRotator(t, t.TempDir(), 3, mb)
		if r.BatchMax() < largest {
			t.Errorf("%d MiB logs: batches of %d bytes, the largest record takes %d", mb, r.BatchMax(), largest)
		}
		r.Close()
	}
}

// A busy batch (the program recording flat out) is stored only where the
// log is large against it and has room for it, and its events compress
// less than 8 times: a small log, or a log whose cut still settles and
// that is full already, gets it compressed, so the logs stay near their
// bound.
func TestRotatorStoresOnlyWhatFits(t *testing.T) {
	const busy = 600 << 10
	small := testRotator(t, t.TempDir(), 3, 2)
	defer small.Close()
	small.zRaw, small.zOut = 1<<20, 1<<19 // compressing halves them
	for i := 0; i < 20; i++ {
		if small.storeBatch(small.cur, busy) {
			t.Fatalf("2 MiB logs: a batch of %d bytes stored", busy)
		}
	}
	big := testRotator(t, t.TempDir(), 3, 20)
	defer big.Close()
	big.zRaw, big.zOut = 1<<20, 1<<19
	stored := 0
	for i := 0; i < 32; i++ {
		if big.storeBatch(big.cur, busy) {
			stored++
		}
	}
	if stored != 30 { // one in 16 compressed: is the ratio still that?
		t.Errorf("20 MiB logs: %d of 32 busy batches stored, want 30", stored)
	}
	if big.storeBatch(big.cur, 64<<10) {
		t.Error("a batch of 64 KiB (a program with time to spare) stored")
	}
	big.cur.bytes = big.maxBytes - busy/2
	if big.storeBatch(big.cur, busy) {
		t.Error("a batch stored past its log's size")
	}
	big.cur.bytes = 0
	big.zOut = 1 << 16 // compressing divides them by 16
	if big.storeBatch(big.cur, busy) && big.busy%storeProbe != 0 {
		t.Error("a batch of events that compress 16 times stored")
	}
}

// A pass that moved no record but its calibration and the threads' marks
// (an idle program with many threads) is not a busy one: the drain then
// sleeps.
func TestRotatorBatchEventsLeaveOutCalibrationsAndMarks(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 1)
	defer r.Close()
	batch := calibRec(1000, 1)
	for tid := int32(1); tid <= 2000; tid++ {
		batch = spool.AppendChunk(batch, format.ChunkMagic, tid, nil) // a drain mark
	}
	if err := r.Write(batch); err != nil {
		t.Fatal(err)
	}
	if n := r.BatchEvents(); n != 0 {
		t.Errorf("an idle pass: %d records, want 0", n)
	}
	if err := r.Write(append(calibRec(2000, 2), chunkOf(7, [][4]uint64{{2100, 0x100, 8, format.RMalloc}, {2200, 0x100, 0, format.RFree}})...)); err != nil {
		t.Fatal(err)
	}
	if n := r.BatchEvents(); n != 2 {
		t.Errorf("a pass of a MALLOC and a FREE: %d records, want 2", n)
	}
}

// A new log grows while its cut settles (50 ms of the program's events,
// more than a small log's size at full speed): the oldest logs go early
// while all of them together hold more than --log-files × --log-file-mb.
func TestRotatorKeepsItsBound(t *testing.T) {
	dir := t.TempDir()
	r := testRotator(t, dir, 3, 1)
	r.storeAll = true // 2 MB a batch: each log ends near twice its size
	tick := uint64(1_000_000)
	for d := 0; d < 20; d++ {
		var recs [][4]uint64
		for i := 0; i < 30000; i++ {
			ptr := 0x10000000 + uint64(i)*64
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, 64, format.RMalloc}, [4]uint64{tick + 5, ptr, 0, format.RFree})
			tick += 10
		}
		if err := writeBatch(r, calibRec(tick, uint64(d+1)), false, threadRecs{7, recs}); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()
	var total int64
	for _, f := range r.Files() {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	if n := len(r.Files()); n > 2 && total > 3<<20 {
		t.Errorf("%d logs kept, %d bytes: past the bound of 3 MiB", n, total)
	}
	if r.Deleted == 0 || len(r.Files()) == 0 {
		t.Errorf("%d logs kept, %d events deleted", len(r.Files()), r.Deleted)
	}
}

// On a full disk a Write refuses at once, and says its batch moved no
// record: the drain then sleeps instead of spinning on batches it drops.
func TestRotatorFullDiskBatchIsNotBusy(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 1)
	defer r.Close()
	var recs [][4]uint64
	for i := uint64(0); i < 20000; i++ {
		recs = append(recs, [4]uint64{2000 + i, 0x100000 + 64*i, 64, format.RMalloc})
	}
	if err := r.Write(append(calibRec(1000, 1), chunkOf(7, recs)...)); err != nil || r.BatchEvents() != 20000 {
		t.Fatalf("a batch of 20000 MALLOCs: %v, %d records", err, r.BatchEvents())
	}
	r.full = true
	if err := r.Write(append(calibRec(30000, 2), chunkOf(7, recs[:1])...)); !errors.Is(err, errLogsFull) || r.BatchEvents() != 0 {
		t.Fatalf("on a full disk: %v, %d records; want errLogsFull, 0", err, r.BatchEvents())
	}
}

// The live table forgets the addresses whose MALLOCs and FREEs paired as
// the run goes (a program whose threads free each other's blocks touches
// far more addresses than it keeps live), but not a FREE that came before
// its MALLOC (another thread's, drained later): that MALLOC, when it comes,
// does not leave its block live.
func TestRotatorSweepsPairedAddresses(t *testing.T) {
	r := testRotator(t, t.TempDir(), 3, 64)
	defer r.Close()
	const handed = 0x7f0000001000
	tick := uint64(1_000_000)
	// Thread 8's FREE of a block thread 7 allocated, drained first.
	if err := r.Write(append(calibRec(tick, 1), chunkOf(8, [][4]uint64{{tick + 20, handed, 0, format.RFree}})...)); err != nil {
		t.Fatal(err)
	}
	kept := map[uint64]bool{}
	for d := 0; d < 10; d++ {
		var recs [][4]uint64
		for i := 0; i < 30000; i++ {
			ptr := 0x10000000 + uint64(d*30000+i)*64 // a new address each time
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, 48, format.RMalloc})
			if i%10000 == 0 {
				kept[ptr] = true
				continue
			}
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, 0, format.RFree})
		}
		if err := r.Write(append(calibRec(tick, uint64(d+2)), chunkOf(7, recs)...)); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.live.idx.Len(); n > 2*sweepFrom {
		t.Errorf("the live table holds %d addresses after 300000 paired ones and %d live", n, len(kept))
	}
	// Thread 7's MALLOC of the block thread 8 freed, stamped before it.
	if err := r.Write(chunkOf(7, [][4]uint64{{1_000_010, handed, 32, format.RMalloc}})); err != nil {
		t.Fatal(err)
	}
	live := map[uint64]bool{}
	for _, b := range r.LiveHost() {
		live[b.Addr] = true
	}
	if len(live) != len(kept) || live[handed] {
		t.Errorf("%d blocks live (the handed-on block: %v), want the %d kept", len(live), live[handed], len(kept))
	}
	for p := range kept {
		if !live[p] {
			t.Errorf("kept block %#x is not live", p)
		}
	}
}
