package capture

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"msmemscope/format"
	"msmemscope/internal/spooltest"
	"msmemscope/spool"
)

// spoolRecs reads every record of sp in time order.
func spoolRecs(t *testing.T, sp *spool.Spool) [][5]uint64 {
	t.Helper()
	var out [][5]uint64
	spooltest.Each(t, sp, func(r *spool.Rec, ns uint64) {
		out = append(out, [5]uint64{uint64(r.Tid), uint64(r.Kind), r.A, r.B, ns})
	})
	return out
}

// combined is what a rotating capture's spool is by definition: the logs
// decompressed (ReadLog) and late.bin, each after the first without its
// header, one after the other.
func combined(t *testing.T, capDir string) [][5]uint64 {
	t.Helper()
	var all []byte
	var later [][2]int64
	for i, f := range spool.LogFiles(capDir) {
		b, err := spool.ReadLog(f)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			b = b[spool.HdrSize:]
			later = append(later, [2]int64{int64(len(all)), int64(len(all) + len(b))})
		}
		all = append(all, b...)
	}
	if late, err := os.ReadFile(filepath.Join(capDir, spool.SpoolDir, spool.LateFile)); err == nil {
		all = append(all, late[spool.HdrSize:]...)
	}
	sp, err := spool.NewLogs(bytes.NewReader(all), int64(len(all)), later)
	if err != nil {
		t.Fatal(err)
	}
	return spoolRecs(t, sp)
}

// rotatedCapture writes a rotating capture of 30 batches (two threads,
// 200 of every 20,000 blocks left live) in 4 MiB logs, and a late.bin.
func rotatedCapture(t *testing.T, stored bool) (capDir string) {
	t.Helper()
	capDir = t.TempDir()
	dir := filepath.Join(capDir, spool.SpoolDir)
	os.Mkdir(dir, 0o750)
	r := testRotator(t, dir, 4, logMB(stored))
	r.storeAll = stored
	tick := uint64(1_000_000)
	for d := 0; d < 30; d++ {
		var recs [][4]uint64
		for i := 0; i < 20000; i++ {
			ptr := 0x10000000 + uint64(d)*0x1000000 + uint64(i)*64
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, 64, format.RMalloc})
			if i%100 != 0 {
				tick += 10
				recs = append(recs, [4]uint64{tick, ptr, 0, format.RFree})
			}
		}
		if err := writeBatch(r, calibRec(tick, uint64(d+1)), stored, threadRecs{7, recs[:len(recs)/2]}, threadRecs{8, recs[len(recs)/2:]}); err != nil {
			t.Fatal(err)
		}
	}
	r.Close()
	if stored != (r.Written >= r.RawBytes) {
		t.Fatalf("stored %v: %d raw bytes, %d written", stored, r.RawBytes, r.Written)
	}
	var late bytes.Buffer
	spool.WriteHeader(&late, 42)
	late.Write(chunkOf(7, [][4]uint64{{tick + 10, 0x10000000, 0, format.RFree}}))
	os.WriteFile(filepath.Join(dir, spool.LateFile), late.Bytes(), 0o640)
	return capDir
}

// OpenCapture reads the logs in place (no temporary spool) and gives what
// their decompressed concatenation gives: whole, with a log cut off by a
// kill, and with a damaged frame.
func TestOpenCaptureReadsLogsInPlace(t *testing.T) {
	t.Run("compressed", func(t *testing.T) { readsLogsInPlace(t, false) })
	t.Run("stored", func(t *testing.T) { readsLogsInPlace(t, true) })
}

func readsLogsInPlace(t *testing.T, stored bool) {
	capDir := rotatedCapture(t, stored)
	logs := spool.LogFiles(capDir)
	if len(logs) < 3 {
		t.Fatalf("%d logs: the test did not rotate", len(logs))
	}
	check := func(what string) {
		t.Helper()
		sp, err := spool.OpenCapture(capDir)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer sp.Close()
		got, want := spoolRecs(t, sp), combined(t, capDir)
		t.Logf("%s: %d records", what, len(got))
		if len(got) == 0 || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: %d records in place, %d combined", what, len(got), len(want))
		}
	}
	check("whole")
	// Every block is MALLOCed once in the kept logs' records (the first
	// log's inherited ones included; the later logs' repeats left out):
	// 200 of every 20,000 stay live, less the one late.bin frees.
	sp, err := spool.OpenCapture(capDir)
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, r := range spoolRecs(t, sp) {
		switch r[1] {
		case format.RMalloc:
			live++
		case format.RFree:
			live--
		}
	}
	sp.Close()
	if live != 30*200-1 {
		t.Fatalf("%d blocks live at the end of the logs, want %d", live, 30*200-1)
	}
	// A kill cuts the last log inside a frame (late.bin gone: after a log
	// cut inside a chunk, the concatenation is not what is read, see
	// TestOpenCaptureLogCutInsideAChunk).
	os.Remove(filepath.Join(capDir, spool.SpoolDir, spool.LateFile))
	last := logs[len(logs)-1]
	b, _ := os.ReadFile(last)
	os.WriteFile(last, b[:len(b)-len(b)/3], 0o640)
	check("cut")
	if sp, err := spool.OpenCapture(capDir); err == nil {
		if len(sp.CutLogs) != 1 || !strings.HasPrefix(sp.CutLogs[0], last+": ") {
			t.Errorf("cut: logs said cut %q, want %s", sp.CutLogs, last)
		}
		sp.Close()
	}
	// A damaged byte inside the second log.
	b, _ = os.ReadFile(logs[1])
	b[len(b)/2] ^= 0xff
	os.WriteFile(logs[1], b, 0o640)
	check("damaged")
}

// A kill during a cut's settling can leave an older log's last frame cut
// short (its records stamped before the cut still went to it) while the
// newer log goes on; a kill can cut the newest log so while late.bin
// follows it. The cut log's content then ends inside a chunk: read with
// what follows, that chunk ends where its whole units end (their whole
// events kept), not across the next log's or late.bin's bytes.
func TestOpenCaptureLogCutInsideAChunk(t *testing.T) {
	t.Run("older", func(t *testing.T) { logCutInsideAChunk(t, 2) })
	t.Run("newest, late.bin after it", func(t *testing.T) { logCutInsideAChunk(t, 1) })
}

// logCutInsideAChunk cuts the back-th log from the end.
func logCutInsideAChunk(t *testing.T, back int) {
	capDir := rotatedCapture(t, false) // (stored, the newest log's last frame holds inherited repeats only)
	sp, err := spool.OpenCapture(capDir)
	if err != nil {
		t.Fatal(err)
	}
	whole := spoolRecs(t, sp)
	sp.Close()
	logs := spool.LogFiles(capDir)
	older := logs[len(logs)-back]
	b, _ := os.ReadFile(older)
	// Cut inside the last frame, where its content ends inside a chunk.
	content, _ := spool.ReadLog(older)
	cutAt := -1
	for cut := len(b) - 1; cut > len(b)/2; cut -= 997 {
		os.WriteFile(older, b[:cut], 0o640)
		got, _ := spool.ReadLog(older)
		if len(got) < len(content) && len(got) > spool.HdrSize && !endsOnChunk(got) {
			cutAt = cut
			break
		}
	}
	if cutAt < 0 {
		t.Fatal("no cut of the log ends inside a chunk")
	}
	sp, err = spool.OpenCapture(capDir)
	if err != nil {
		t.Fatalf("log cut at byte %d of %d: %v", cutAt, len(b), err)
	}
	defer sp.Close()
	if !sp.Truncated {
		t.Error("a capture with a log cut short reads as whole")
	}
	got := spoolRecs(t, sp)
	// The MALLOCs and FREEs read are the whole capture's less some of the
	// cut log's (those of equal time may come in another order).
	left := map[[5]uint64]int{}
	for _, r := range whole {
		left[r]++
	}
	for _, r := range got {
		if r[1] != format.RMalloc && r[1] != format.RFree {
			continue
		}
		if left[r] == 0 {
			t.Fatalf("record %v is not the uncut capture's", r)
		}
		left[r]--
	}
	newest, err := spool.OpenLog(logs[len(logs)-1])
	if err != nil {
		t.Fatal(err)
	}
	defer newest.Close()
	first := spoolRecs(t, newest)
	if len(got) >= len(whole) || len(got) < len(first) {
		t.Fatalf("%d records read, %d uncut, %d in the newest log alone", len(got), len(whole), len(first))
	}
	// Every FREE the cut log holds, read alone, is read (a FREE is never a
	// later log's repeat): those of its last chunk's whole units too.
	alone, err := spool.OpenLog(older)
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	read := map[[4]uint64]int{}
	for _, r := range got {
		read[[4]uint64(r[:4])]++
	}
	frees := 0
	for _, r := range spoolRecs(t, alone) {
		if r[1] == format.RFree {
			if frees++; read[[4]uint64(r[:4])] == 0 {
				t.Fatalf("FREE %v of the cut log, read alone, is not read with the others", r)
			}
			read[[4]uint64(r[:4])]--
		}
	}
	// late.bin's FREE (thread 7's) is read as it was written.
	if late := [4]uint64{7, format.RFree, 0x10000000, 0}; read[late] == 0 {
		t.Errorf("late.bin's FREE %v is not read", late)
	}
	t.Logf("%d of %d records read; the cut log's %d FREEs among them", len(got), len(whole), frees)
}

// endsOnChunk reports whether a log's content ends where a chunk does.
func endsOnChunk(b []byte) bool {
	off := spool.HdrSize
	for off+spool.ChunkHdrSize <= len(b) {
		off += spool.ChunkHdrSize + int(binary.LittleEndian.Uint32(b[off+format.ChunkNUnitOff:]))*spool.UnitSize
	}
	return off == len(b)
}
