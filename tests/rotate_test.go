package tests

import (
	"path/filepath"
	"testing"
)

// TestRotateWholeExact: a pool of 8 threads freeing each other's blocks,
// recorded into rotating logs of 1 MiB and converted (the logs read
// together): the dump's totals are valgrind's, nothing unpaired.
func TestRotateWholeExact(t *testing.T) {
	bin := compile(t, "pool.c", "", "-pthread")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--log-mode=rotate", "--log-files=1000", "--log-file-mb=1", bin)
	p := readManifest(t, out).main(t)
	logs, _ := filepath.Glob(filepath.Join(p.Folder, "spool", "log_*.zst"))
	if len(logs) < 3 {
		t.Fatalf("want several rotated logs, got %d", len(logs))
	}
	got := hostTotalsOf(t, p)
	root, vg, _ := valgrindHeap(t, false, bin)
	sameTotals(t, "pool8 rotated", got, vg[root])
	orderSettled(t, p.Folder)
}
