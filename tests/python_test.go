package tests

import (
	"debug/elf"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"msmemscope/trace"
)

// runPython runs `msmemscope -- $PYTHON -c code` with a 120 s timeout (a hang
// fails the test) and checks the capture is whole: exit 0, "ok" printed, one
// traced process whose capture is complete and ends with PROCESS_EXIT. It
// returns the process and the sizes of its HOST MALLOC rows.
func runPython(t *testing.T, code string) (*processInfo, map[uint64]int) {
	t.Helper()
	py := pythonPath(t)
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 120*time.Second, "", "--output="+out, "--", py, "-c", code)
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != "ok" {
		t.Fatalf("exit %d, stdout %q, want 0 and \"ok\"\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
	}
	t.Logf("took %v", r.Elapsed)
	m := readManifest(t, out)
	if len(m.Processes) != 1 {
		t.Fatalf("want 1 traced process (forked children are not traced), manifest lists %d", len(m.Processes))
	}
	mp := m.main(t)
	cfg := readConfig(t, mp.Folder)
	if !mp.Complete || !cfg.Complete || *cfg.EventsLost != 0 {
		t.Errorf("capture: complete %v/%v, events lost %d; want complete, 0 lost", mp.Complete, cfg.Complete, *cfg.EventsLost)
	}
	sizes := map[uint64]int{}
	var last *trace.Event
	scanDump(t, mp.Dump, true, func(e *trace.Event) {
		if e.Kind == trace.KindMalloc && e.Type == trace.TypeHost {
			sizes[e.Size]++
		}
		last = e
	})
	if last.Kind != trace.KindSystem || last.Type != trace.TypeProcessExit {
		t.Errorf("the last row is %s %s, want SYSTEM PROCESS_EXIT", last.Kind, last.Type)
	}
	if len(sizes) == 0 {
		t.Fatal("no HOST MALLOC rows")
	}
	return mp, sizes
}

// TestPythonMultiprocessingFork: a Python program using multiprocessing with
// the fork start method (Pool(2).map) finishes normally under msmemscope. The
// two workers are forked without exec: not traced, counted in config.json;
// what they allocate (777777-byte bytearrays) is not in the parent's dump,
// what the parent allocates (888888) is.
func TestPythonMultiprocessingFork(t *testing.T) {
	mp, sizes := runPython(t, `
import multiprocessing as mp
def work(x):
    return len(bytearray(777777)) + x
if __name__ == "__main__":
    keep = bytearray(888888)
    with mp.get_context("fork").Pool(2) as pool:
        r = pool.map(work, range(40))
    assert r == [777777 + x for x in range(40)], r
    print("ok")
`)
	if c := readConfig(t, mp.Folder); *c.ForkedChildrenUntraced != 2 {
		t.Errorf("forked_children_untraced = %d, want 2 (the pool's workers)", *c.ForkedChildrenUntraced)
	}
	if sizes[888889] != 1 {
		t.Errorf("the parent's bytearray(888888) (a MALLOC of 888889 bytes) appears %d times, want 1", sizes[888889])
	}
	if sizes[777778] != 0 {
		t.Errorf("the workers' allocations (777778 bytes) are in the parent's dump %d times", sizes[777778])
	}
}

// TestPythonOsFork: a Python program calling os.fork() whose child allocates
// finishes normally; the child is not traced and counted.
func TestPythonOsFork(t *testing.T) {
	mp, sizes := runPython(t, `
import os
big = bytearray(654321)
pid = os.fork()
if pid == 0:
    x = [bytearray(123457) for _ in range(10)]
    os._exit(0 if len(x) == 10 else 1)
_, st = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(st) == 0
print("ok")
`)
	if c := readConfig(t, mp.Folder); *c.ForkedChildrenUntraced != 1 {
		t.Errorf("forked_children_untraced = %d, want 1", *c.ForkedChildrenUntraced)
	}
	if sizes[654322] != 1 {
		t.Errorf("the parent's bytearray(654321) appears %d times, want 1", sizes[654322])
	}
	if sizes[123458] != 0 {
		t.Errorf("the child's allocations are in the parent's dump %d times", sizes[123458])
	}
}

// TestSystemPythonNotPIE: Debian's and Ubuntu's /usr/bin/python3 are built
// without PIE, and CPython takes malloc's address for its allocator table,
// so the program owns malloc's canonical address (its PLT entry). The
// preloaded library must still know it is interposed: it once took itself
// for a library Python had loaded with ctypes and waited for start(), and
// such a run left no capture at all.
func TestSystemPythonNotPIE(t *testing.T) {
	py := "/usr/bin/python3"
	f, err := elf.Open(py)
	if err != nil {
		t.Skipf("%s: %v", py, err)
	}
	pie := f.Type == elf.ET_DYN
	f.Close()
	if pie {
		t.Skipf("%s is a PIE: not the case this test is for", py)
	}
	out := filepath.Join(t.TempDir(), "out")
	r := runCLIEnv(t, 120*time.Second, "", []string{"PYTHONMALLOC=malloc"}, "--output="+out, "--", py, "-c",
		"b = bytearray(1234567); print('ok')")
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != "ok" {
		t.Fatalf("exit %d, stdout %q\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
	}
	found := 0
	scanDump(t, readManifest(t, out).main(t).Dump, true, func(e *trace.Event) {
		if e.Kind == trace.KindMalloc && e.Type == trace.TypeHost && e.Size == 1234568 {
			found++ // the bytearray and its NUL
		}
	})
	if found != 1 {
		t.Errorf("%d MALLOCs of the 1234567-byte bytearray, want 1", found)
	}
}
