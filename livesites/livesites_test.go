package livesites

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"msmemscope/format"
	"msmemscope/internal/spooltest"
	"msmemscope/spool"
)

func malloc(ts, addr, size uint64) spool.Rec {
	return spool.Rec{Kind: format.RMalloc, Flags: format.FHost, TS: ts, A: addr, B: size}
}

func free(ts, addr uint64) spool.Rec {
	return spool.Rec{Kind: format.RFree, Flags: format.FHost, TS: ts, A: addr}
}

// epoch stamps a record with drain epoch e only.
func epoch(r spool.Rec, e uint64) spool.Rec {
	r.TS = format.TSEpoch | e
	return r
}

// calib starts drain epoch e at tick; the one before had ended by end (the
// drain's stamp once the gate had moved).
func calib(e, tick, end uint64) spool.Rec {
	return spool.Rec{Kind: format.RCalib, Flags: format.FEpoch, TS: tick, B: e, Payload: binary.LittleEndian.AppendUint64(nil, end)}
}

// follow writes the spool header, then each pass's chunks before a catch-up,
// and returns the set and its totals after each catch-up.
func follow(t *testing.T, passes ...[][]byte) (*Set, []Totals) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "spool.bin")
	var hdr bytes.Buffer
	if err := spool.WriteHeader(&hdr, 7); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, hdr.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	tail, err := spool.OpenTail(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tail.Close() })
	s := New(tail, func(uint16) bool { return true }, true)
	var tots []Totals
	for _, chunks := range passes {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chunks {
			f.Write(c)
		}
		f.Close()
		if err := s.CatchUp(); err != nil {
			t.Fatal(err)
		}
		tots = append(tots, s.Totals())
	}
	return s, tots
}

// A FREE drained before the MALLOC it ends (another thread's chunk read
// first) ends it when the MALLOC comes.
func TestFreeReadBeforeItsMalloc(t *testing.T) {
	s, tots := follow(t, [][]byte{
		spooltest.Chunk(2, free(300, 0xA0)),
		spooltest.Chunk(1, malloc(100, 0xA0, 16), malloc(200, 0xB0, 32)),
	})
	if tots[0].Live != 32 || s.Blocks() != 1 || len(s.orphans) != 0 {
		t.Errorf("live %d in %d blocks, %d orphans; want 32 in 1, 0", tots[0].Live, s.Blocks(), len(s.orphans))
	}
}

// An address freed by one thread and allocated again by another whose
// chunk is read first: the late FREE ends the block it was for (already
// replaced), not the new one, and the new one's own FREE ends it.
func TestFreeOfAReplacedBlock(t *testing.T) {
	_, tots := follow(t,
		[][]byte{spooltest.Chunk(1, malloc(100, 0xA0, 16))},
		[][]byte{
			spooltest.Chunk(3, malloc(400, 0xA0, 64)), // the address again, before thread 2's FREE is read
			spooltest.Chunk(2, free(300, 0xA0)),
		},
		[][]byte{spooltest.Chunk(3, free(500, 0xA0))},
	)
	want := []uint64{16, 64, 0}
	for i, w := range want {
		if tots[i].Live != w {
			t.Errorf("after catch-up %d: live %d, want %d (all %+v)", i+1, tots[i].Live, w, tots)
		}
	}
}

// A tick and an epoch compare by the epoch's span: a FREE stamped with an
// epoch that ended before a MALLOC's tick freed an older block of that
// address (one allocated before the capture), not this one; one whose
// epoch began after the MALLOC's tick freed it.
func TestTickAgainstEpochSpan(t *testing.T) {
	s, tots := follow(t, [][]byte{
		spooltest.Chunk(0, calib(5, 1000, 1000), calib(6, 2000, 2100), calib(7, 6000, 6100)),
		spooltest.Chunk(2, epoch(free(0, 0xA0), 5), epoch(free(0, 0xB0), 7)),
		spooltest.Chunk(1, malloc(5000, 0xA0, 16), malloc(5000, 0xB0, 32)),
	})
	if tots[0].Live != 16 || s.Blocks() != 1 {
		t.Errorf("live %d in %d blocks; want 16 (0xA0's FREE in epoch 5, ended by 2100, came before its MALLOC at 5000) in 1", tots[0].Live, s.Blocks())
	}
}

// A FREE whose block was replaced at its address never comes (lost): the
// stamps still tell the new block's own FREE, from another thread, from
// the lost one's.
func TestLostFreeThenHandoff(t *testing.T) {
	_, tots := follow(t,
		[][]byte{spooltest.Chunk(1, malloc(100000, 0xA0, 16))},
		[][]byte{spooltest.Chunk(2, malloc(300000, 0xA0, 64))}, // thread 1's FREE of 0xA0 is lost
		[][]byte{spooltest.Chunk(3, free(400000, 0xA0))},       // thread 2 handed its block to thread 3
	)
	if tots[2].Live != 0 {
		t.Errorf("live %d after every block was freed: a FREE was taken for the lost one", tots[2].Live)
	}
}

// A FREE stamped before the MALLOC of the block now at its address freed an
// older block (one allocated before the capture): the live block stays.
func TestFreeOfAnOlderUnseenBlock(t *testing.T) {
	s, tots := follow(t, [][]byte{
		spooltest.Chunk(1, malloc(300000, 0xA0, 16)),
		spooltest.Chunk(2, free(100000, 0xA0)),
	})
	if tots[0].Live != 16 || s.Blocks() != 1 {
		t.Errorf("live %d in %d blocks, want 16 in 1", tots[0].Live, s.Blocks())
	}
}

// Three threads on one address, their chunks read newest first: the block
// live is the newest MALLOC's.
func TestOlderMallocReadLate(t *testing.T) {
	s, tots := follow(t, [][]byte{
		spooltest.Chunk(3, malloc(30000, 0xA0, 64)),
		spooltest.Chunk(1, malloc(10000, 0xA0, 16)),
		spooltest.Chunk(2, free(20000, 0xA0)),
	})
	if tots[0].Live != 64 || s.Blocks() != 1 {
		t.Errorf("live %d in %d blocks, want 64 in 1", tots[0].Live, s.Blocks())
	}
}

// A FREE read long before its MALLOC (the first half of a pair unit waits
// in its thread's ring until the thread records again) still ends it; past
// maxOrphans addresses, FREEs two catch-ups old are forgotten.
func TestOrphansKeptThenForgotten(t *testing.T) {
	_, tots := follow(t,
		[][]byte{spooltest.Chunk(2, free(500000, 0xA0))},
		[][]byte{spooltest.Chunk(3, malloc(600000, 0xC0, 8))},
		[][]byte{spooltest.Chunk(3, malloc(700000, 0xD0, 8))},
		[][]byte{spooltest.Chunk(1, malloc(100000, 0xA0, 16))},
	)
	if tots[3].Live != 16 {
		t.Errorf("live %d, want 16 (0xC0, 0xD0): the FREE read three catch-ups before its MALLOC was forgotten", tots[3].Live)
	}
	defer func(n int) { maxOrphans = n }(maxOrphans)
	maxOrphans = 1
	s, _ := follow(t,
		[][]byte{spooltest.Chunk(2, free(50, 0xA0), free(60, 0xB0))},
		[][]byte{spooltest.Chunk(1, malloc(100, 0xC0, 8))},
		[][]byte{spooltest.Chunk(1, malloc(200, 0xD0, 8))},
	)
	if len(s.orphans) != 0 {
		t.Errorf("%d addresses still hold FREEs with no block", len(s.orphans))
	}
}

// A failed realloc's block lives on (not a new allocation); msmemscope's own
// blocks count nowhere and their FREEs pair.
func TestUndoAndOwnBlocks(t *testing.T) {
	undo := malloc(300, 0xA0, 0)
	undo.Flags |= format.FUndo
	own := malloc(400, 0xB0, 100)
	own.Flags |= format.FOwn
	s, tots := follow(t, [][]byte{
		spooltest.Chunk(1, malloc(100, 0xA0, 16), free(200, 0xA0), undo, own, free(500, 0xB0)),
	})
	if tots[0].Live != 16 || tots[0].Allocations != 1 || s.Blocks() != 1 || len(s.orphans) != 0 {
		t.Errorf("live %d, %d allocations, %d blocks, %d orphans; want 16, 1, 1, 0", tots[0].Live, tots[0].Allocations, s.Blocks(), len(s.orphans))
	}
}

// The peak and the sites at it are kept; the report names each site once.
func TestPeakAndReport(t *testing.T) {
	s, tots := follow(t, [][]byte{
		spooltest.Chunk(1, malloc(100, 0xA0, 16), malloc(200, 0xB0, 32), free(300, 0xA0), free(400, 0xB0), malloc(500, 0xC0, 8)),
	})
	if tots[0].Peak != 48 || tots[0].Live != 8 {
		t.Errorf("peak %d live %d; want 48, 8", tots[0].Peak, tots[0].Live)
	}
	atPeak, now := s.Named(0)
	if len(atPeak) != 1 || atPeak[0].Size != 48 || atPeak[0].Count != 2 || len(now) != 1 || now[0].Size != 8 {
		t.Errorf("at the peak %+v, now %+v", atPeak, now)
	}
	for i := 0; i < 2; i++ { // the second from the names kept
		if r := s.Report(); r.TotalSize != 8 || len(r.Report) != 1 || r.Report[0].Count != 1 || r.Report[0].Site != atPeak[0].Site {
			t.Errorf("report %d: %+v", i+1, r)
		}
	}
}

// A thread's blocks freed by another thread that ran after it count
// together at the peak, though the freeing thread's chunk is read first:
// records count in the order they happened (merge.go), the first thread's
// epoch-stamped ones after its precise first.
func TestPeakInTimeOrder(t *testing.T) {
	s, tots := follow(t, [][]byte{
		spooltest.Chunk(0, calib(5, 1000, 0)),
		spooltest.Chunk(2, free(9000, 0xA0), free(9001, 0xB0), free(9002, 0xC0)),
		spooltest.Chunk(1, malloc(1100, 0xA0, 100), epoch(malloc(0, 0xB0, 200), 5), epoch(malloc(0, 0xC0, 400), 5)),
	})
	if tots[0].Peak != 700 || tots[0].Live != 0 || s.Blocks() != 0 || len(s.orphans) != 0 {
		t.Errorf("peak %d, live %d in %d blocks, %d orphans; want peak 700, nothing live", tots[0].Peak, tots[0].Live, s.Blocks(), len(s.orphans))
	}
}

// A FREE of an address no block holds does not wait for another thread's
// MALLOC of that address stamped well after it (a new block at a reused
// address): the threads' records still count in time order, so the two
// blocks live together make the peak.
func TestFreeDoesNotWaitForALaterReuse(t *testing.T) {
	_, tots := follow(t, [][]byte{
		spooltest.Chunk(1, free(100_000, 0xA0), malloc(200_000, 0xB0, 1000), free(300_000, 0xB0)),
		spooltest.Chunk(2, malloc(250_000, 0xC0, 1000), free(350_000, 0xC0), malloc(400_000, 0xA0, 16)),
	})
	if tots[0].Peak != 2000 || tots[0].Live != 16 {
		t.Errorf("peak %d, live %d; want 2000, 16", tots[0].Peak, tots[0].Live)
	}
}

// With C stacks, a MALLOC may name its stack by id (F_STACKID, the stack
// written once in an R_STACK record): its site is the stack's innermost
// frame, not the id, and the stacks of one innermost frame are one site,
// with that frame's blocks recorded with whole stacks.
func TestSitesOfStackIDs(t *testing.T) {
	stack := func(id, top uint64) spool.Rec {
		return spool.Rec{Kind: format.RStack, Flags: format.FCStack, TS: 1, A: id, B: 2,
			Payload: binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, top), 0x9999)}
	}
	byID := func(ts, addr, size, id uint64) spool.Rec {
		r := malloc(ts, addr, size)
		r.Flags |= format.FCStack | format.FStackID
		r.Payload = binary.LittleEndian.AppendUint64(nil, id)
		return r
	}
	whole := malloc(500, 0xD0, 4)
	whole.Flags |= format.FCStack
	whole.Payload = binary.LittleEndian.AppendUint64(nil, 0x1234)
	s, _ := follow(t, [][]byte{
		spooltest.Chunk(1, stack(7, 0x1234), stack(8, 0x1234), stack(9, 0x5678),
			byID(100, 0xA0, 16, 7), byID(200, 0xB0, 32, 8), byID(300, 0xC0, 8, 9), whole),
	})
	_, now := s.Named(0)
	if len(now) != 2 || now[0].Size != 52 || now[0].Count != 3 || now[1].Size != 8 || now[1].Count != 1 {
		t.Fatalf("sites now %+v, want 52 bytes in 3 blocks at 0x1234 and 8 in 1 at 0x5678", now)
	}
	if r := s.Report(); len(r.Report) != 2 || r.Report[0].Size != 52 || r.Report[0].Site != now[0].Site || r.Report[0].Site == "0x7" {
		t.Errorf("report %+v", r)
	}
}
