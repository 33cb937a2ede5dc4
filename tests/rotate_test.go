package tests

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"msmemscope/spool"
	"msmemscope/trace"
)

// TestRotateWholeExact: a pool of 8 threads freeing each other's blocks,
// recorded into rotating logs of 1 MiB: the run writes no dump at exit
// (the logs are its record, config.json counts their rows); converted with
// --input= (the logs read together), the dump's totals are valgrind's,
// nothing unpaired.
func TestRotateWholeExact(t *testing.T) {
	bin := compile(t, "pool.c", "", "-pthread")
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 0, out, "--log-mode=rotate", "--log-files=1000", "--log-file-mb=1", bin)
	p := readManifest(t, out).main(t)
	logs, _ := filepath.Glob(filepath.Join(p.Folder, "spool", "log_*.zst"))
	if len(logs) < 3 {
		t.Fatalf("want several rotated logs, got %d", len(logs))
	}
	if dumps, _ := filepath.Glob(filepath.Join(p.Folder, "dump", "memscope_dump_*")); len(dumps) > 0 || p.Dump != "" {
		t.Fatalf("a rotated run wrote a dump at exit: %v (manifest: %q)", dumps, p.Dump)
	}
	c := readConfig(t, p.Folder)
	if kept := c.EventsNotWritten[spool.NotWrittenInLogs]; kept == 0 || c.EventsWritten != 0 || !strings.Contains(r.Stderr, "--input="+p.Folder) {
		t.Fatalf("config.json: %d rows kept in the logs, %d written; stderr:\n%s", kept, c.EventsWritten, r.Stderr)
	}
	if c.EventsInDeletedLogs != 0 {
		t.Errorf("config.json: events_in_deleted_logs %d, want 0 (no log was deleted)", c.EventsInDeletedLogs)
	}
	orderSettled(t, p.Folder)
	mustRun(t, 0, filepath.Join(t.TempDir(), "o"), "--input="+p.Folder)
	dump := dumpOf(t, p.Folder)
	got := hostTotals(t, readDump(t, dump))
	root, vg, _ := valgrindHeap(t, false, bin)
	sameTotals(t, "pool8 rotated", got, vg[root])
}

// TestRotateLogsReadAlone: programs whose threads free each other's blocks,
// recorded into rotating logs of 1-2 MiB, the oldest deleted: nothing came
// late, each kept log read alone pairs every FREE with its block and invents
// none, and the newest ends with the blocks valgrind finds in use at exit.
func TestRotateLogsReadAlone(t *testing.T) {
	needBuild(t)
	// The pool allocates flat out on every thread: its logs' cuts wait
	// longest for lagging threads (2 MiB logs keep that within the bound).
	for prog, mb := range map[string]string{"handoff.c": "1", "pool.c": "2"} {
		t.Run(prog, func(t *testing.T) {
			bin := compile(t, prog, "", "-pthread")
			out := filepath.Join(t.TempDir(), "out")
			mustRun(t, 0, out, "--log-mode=rotate", "--log-files=3", "--log-file-mb="+mb, bin)
			p := readManifest(t, out).main(t)
			c := readConfig(t, p.Folder)
			if c.RotateLate != 0 {
				t.Errorf("config.json: rotate_late %d, want 0", c.RotateLate)
			}
			orderSettled(t, p.Folder)
			logs := spool.LogFiles(p.Folder)
			if len(logs) == 0 {
				t.Fatal("no rotated logs")
			}
			// The deleted logs' events are counted (the kept ones' are
			// events_recorded). (A loaded machine drains in larger
			// batches, so fewer, larger logs: then none may go.)
			if deleted := logNumber(t, logs[len(logs)-1]) > 3; deleted && c.EventsInDeletedLogs == 0 {
				t.Errorf("config.json: events_in_deleted_logs 0, but logs were deleted (%v kept)", logs)
			} else if !deleted {
				t.Logf("%d logs written, none deleted", len(logs))
			}
			meta, err := spool.ReadMeta(p.Folder)
			if err != nil {
				t.Fatal(err)
			}
			_, vg, _ := valgrindHeap(t, false, bin)
			var want heapTotals
			for _, h := range vg {
				want = h
			}
			for i, log := range logs {
				sp, err := spool.OpenWholeLog(log)
				if err != nil {
					t.Fatal(err)
				}
				d := spool.NewDecoder(sp, p.Folder, meta, meta.Config)
				d.JudgeOnly()
				live := map[uint64]uint64{}
				for {
					e, err := d.Next()
					if err != nil {
						t.Fatal(err)
					}
					if e == nil {
						break
					}
					switch e.Kind {
					case trace.KindMalloc:
						live[e.AllocID] = e.Size
					case trace.KindFree:
						delete(live, e.AllocID)
					}
				}
				sp.Close()
				o, nw := d.Order(), d.Unwritten()
				if o.UnpairedFree != 0 || o.LostFree != 0 || nw[spool.NotWrittenUntracked] != 0 {
					t.Errorf("%s read alone: order %+v, not written %v", filepath.Base(log), o, nw)
				}
				var bytes uint64
				for _, n := range live {
					bytes += n
				}
				t.Logf("%s read alone: %d blocks (%d bytes) live at its end, order %+v", filepath.Base(log), len(live), bytes, o)
				if i == len(logs)-1 && (uint64(len(live)) != want.InUseBlocks || bytes != want.InUseBytes) {
					t.Errorf("newest log: %d blocks (%d bytes) live at its end; valgrind: in use at exit %d blocks (%d bytes)",
						len(live), bytes, want.InUseBlocks, want.InUseBytes)
				}
			}
		})
	}
}

// logNumber is the N of log_NNNNNN.zst.
func logNumber(t *testing.T, path string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(path), spool.LogPrefix), spool.LogSuffix))
	if err != nil {
		t.Fatalf("%s: not a log's name: %v", path, err)
	}
	return n
}
