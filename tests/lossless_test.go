package tests

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"msmemscope/spool"
	"msmemscope/trace"
)

// Constants of progs/lossless.c.
const (
	losslessThreads = 8
	losslessPairs   = 1000000
	losslessSize    = 1000
)

// TestLossless: 8 threads x 1 M malloc/free pairs. Every pair is in the dump
// (thread t's blocks have size 1000+t): exactly 1 M MALLOC and 1 M FREE rows
// per thread, alternating on the same allocation_id; the rows written equal
// config.json's events_written, and events_lost is 0.
//
// It runs twice: with the drain's direct writes of filled ring segments
// (the default; the spool then holds padding chunks wherever the file system
// takes O_DIRECT) and with MSMEMSCOPE_DIRECT_IO=0 (all through the page
// cache, no padding).
func TestLossless(t *testing.T) {
	bin := compile(t, "lossless.c", "", "-pthread")
	t.Run("direct", func(t *testing.T) { checkLossless(t, bin, nil) })
	t.Run("page-cache", func(t *testing.T) { checkLossless(t, bin, []string{"MSMEMSCOPE_DIRECT_IO=0"}) })
}

func checkLossless(t *testing.T, bin string, env []string) {
	out := filepath.Join(t.TempDir(), "out")
	r := runCLIEnv(t, 120*time.Second, "", env, "--output="+out, bin)
	if r.Code != 0 {
		t.Fatalf("msmemscope: exit %d\n%s", r.Code, r.Stderr)
	}
	t.Logf("run and conversion took %v", r.Elapsed)
	m := readManifest(t, out)
	mp := m.main(t)
	cfg := readConfig(t, mp.Folder)
	sp, err := spool.OpenFile(filepath.Join(mp.Folder, "spool", spool.FileName))
	if err != nil {
		t.Fatal(err)
	}
	pad := sp.PadBytes
	sp.Close()
	switch direct := env == nil; {
	case direct && directIOWorks(out) && pad == 0:
		t.Errorf("the spool has no padding chunks: filled segments were not written directly")
	case !direct && pad != 0:
		t.Errorf("MSMEMSCOPE_DIRECT_IO=0, yet the spool holds %d bytes of padding", pad)
	}
	t.Logf("spool: %d bytes of padding", pad)
	if *cfg.EventsLost != 0 || mp.Lost != 0 {
		t.Errorf("events lost: config.json %d, manifest %d; want 0", *cfg.EventsLost, mp.Lost)
	}

	type thr struct {
		mallocs, frees int
		open           uint64 // allocation_id of the block malloc'd and not yet freed
		tid            int64
	}
	var per [losslessThreads]thr
	byTid := map[int64]int{} // tid -> thread index (from its block size)
	other := 0
	rows := scanDump(t, mp.Dump, true, func(e *trace.Event) {
		if !e.IsMemory() || e.Type != trace.TypeHost || e.Size < losslessSize || e.Size >= losslessSize+losslessThreads {
			other++
			return
		}
		i := int(e.Size - losslessSize)
		th := &per[i]
		if j, ok := byTid[e.Tid]; ok && j != i {
			t.Fatalf("row %d: thread %d allocates both %d and %d bytes", e.ID, e.Tid, losslessSize+j, e.Size)
		}
		byTid[e.Tid] = i
		switch e.Kind {
		case trace.KindMalloc:
			if th.open != 0 {
				t.Fatalf("row %d: thread %d MALLOC before the FREE of allocation_id %d", e.ID, e.Tid, th.open)
			}
			th.mallocs++
			th.open = e.AllocID
		case trace.KindFree:
			if th.open != e.AllocID {
				t.Fatalf("row %d: thread %d FREE of allocation_id %d, open block %d", e.ID, e.Tid, e.AllocID, th.open)
			}
			th.frees++
			th.open = 0
		}
	})
	t.Logf("%d rows: %d MALLOC/FREE pairs' rows, %d others", rows, rows-other, other)
	for i, th := range per {
		if th.mallocs != losslessPairs || th.frees != losslessPairs {
			t.Errorf("thread %d (%d-byte blocks): %d MALLOC and %d FREE rows, want %d each",
				i, losslessSize+i, th.mallocs, th.frees, losslessPairs)
		}
	}
	if len(byTid) != losslessThreads {
		t.Errorf("pairs came from %d threads, want %d", len(byTid), losslessThreads)
	}
	if uint64(rows) != cfg.EventsWritten || uint64(rows) != mp.Rows {
		t.Errorf("dump has %d rows; config.json events_written %d, manifest rows_written %d", rows, cfg.EventsWritten, mp.Rows)
	}
	// The program makes nothing else but thread start-up and exit: a handful
	// of rows (SYSTEM, the threads' TLS and stacks).
	if other > 100 {
		t.Errorf("%d rows besides the pairs: expected a handful", other)
	}
}

// directIOWorks says whether files in dir take O_DIRECT (tmpfs does not).
func directIOWorks(dir string) bool {
	f, err := os.CreateTemp(dir, "dio")
	if err != nil {
		return false
	}
	defer os.Remove(f.Name())
	f.Close()
	fd, err := unix.Open(f.Name(), unix.O_WRONLY|unix.O_DIRECT, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}
