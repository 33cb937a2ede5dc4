package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"msmemscope/trace"
)

// pyStackScript reads tests/progs/pystack_kinds.py: bytearrays of known
// sizes from a method, a generator, a lambda that C code calls (map: an
// entry shim frame sits between it and its caller from 3.12 on), a
// multi-line call, a thread and a function whose name is not ASCII (a
// 2-byte-kind str). Next to each, it prints the stack as Python itself sees
// it (f_lineno through f_back), the oracle the MALLOC row's stack must equal.
func pyStackScript(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(repoRoot, "tests", "progs", "pystack_kinds.py"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// pyInterpreters finds CPython 3.minor interpreters under $PYENV_ROOT
// (default ~/.pyenv): the newest patch release of each minor asked for.
func pyInterpreters(minors ...int) map[int]string {
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		home, _ := os.UserHomeDir()
		root = filepath.Join(home, ".pyenv")
	}
	found := map[int]string{}
	for _, m := range minors {
		ps, _ := filepath.Glob(filepath.Join(root, "versions", fmt.Sprintf("3.%d.*", m), "bin", fmt.Sprintf("python3.%d", m)))
		sort.Strings(ps)
		if len(ps) > 0 {
			found[m] = ps[len(ps)-1]
		}
	}
	return found
}

// runPyStacks runs the script under the CLI with Python stacks on and
// returns stderr, the oracle stacks by MALLOC size and the rows' stacks.
func runPyStacks(t *testing.T, py string) (stderr string, oracle, got map[uint64]string, script string) {
	t.Helper()
	dir := t.TempDir()
	script = filepath.Join(dir, "prog.py")
	src := pyStackScript(t)
	if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	r := runCLI(t, 120*time.Second, dir, "--output="+out, "--call-stack=python:16", "--", py, script)
	if r.Code != 0 || !strings.HasSuffix(strings.TrimSpace(r.Stdout), "ok") {
		t.Fatalf("exit %d, stdout %q\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
	}
	oracle = map[uint64]string{}
	for _, l := range strings.Split(r.Stdout, "\n") {
		var size uint64
		var st string
		if n, _ := fmt.Sscanf(l, "STACK %d %s", &size, &st); n == 2 {
			oracle[size] = st
		}
	}
	got = map[uint64]string{}
	scanDump(t, readManifest(t, out).main(t).Dump, true, func(e *trace.Event) {
		if e.Kind == trace.KindMalloc && e.Type == trace.TypeHost && oracle[e.Size] != "" {
			got[e.Size] = e.PyStack
		}
	})
	return r.Stderr, oracle, got, script
}

func lineOf(src, marker string) int {
	for i, l := range strings.Split(src, "\n") {
		if strings.Contains(l, marker) {
			return i + 1
		}
	}
	panic(marker)
}

// TestPythonStacksPerVersion: on each CPython with a frame layout (3.10 to
// 3.13) a MALLOC row's Python stack is the one Python sees, frame for frame
// (file, line, function), innermost first; on one without (3.9) the capture
// runs, warns once and has no Python stacks. A version not installed is
// skipped.
func TestPythonStacksPerVersion(t *testing.T) {
	pys := pyInterpreters(9, 10, 11, 12, 13)
	for _, m := range []int{10, 11, 12, 13} {
		t.Run(fmt.Sprintf("3.%d", m), func(t *testing.T) {
			py := pys[m]
			if py == "" {
				t.Skipf("no CPython 3.%d under $PYENV_ROOT", m)
			}
			_, oracle, got, script := runPyStacks(t, py)
			if len(oracle) != 6 {
				t.Fatalf("the script printed %d stacks, want 6: %v", len(oracle), oracle)
			}
			frame := func(marker, fn string) string {
				return fmt.Sprintf("%s:%d(%s)", script, lineOf(pyStackScript(t), marker), fn)
			}
			block := frame("# the block", "make_block")
			wantTop := map[uint64]string{
				1000002: block + ";" + frame("# the method", "method"),
				1000003: block + ";" + frame("# the gen", "gen"),
				1000004: block + ";" + frame("# the map", "<lambda>") + ";" + frame("# the map", "via_c"),
				1000005: block + ";" + frame("# the multi", "multi"),
				1000006: block + ";" + frame("# the thread", "th"),
				1000007: block + ";" + frame("# the names", "Ωmega"),
			}
			for size, top := range wantTop {
				if !strings.HasPrefix(oracle[size], top+";") {
					t.Errorf("%d: Python says %q, the test expects it to start with %q", size, oracle[size], top)
				}
				if got[size] != oracle[size] {
					t.Errorf("MALLOC of %d bytes: Python stack\n got %q\nwant %q", size, got[size], oracle[size])
				}
			}
		})
	}
	t.Run("3.9", func(t *testing.T) {
		py := pys[9]
		if py == "" {
			t.Skip("no CPython 3.9 under $PYENV_ROOT")
		}
		stderr, oracle, got, _ := runPyStacks(t, py)
		const warn = "Python 3.9: no supported frame layout, so MALLOC rows carry no Python stack (CPython 3.10, 3.11, 3.12 and 3.13 are supported)"
		if strings.Count(stderr, warn) != 1 {
			t.Errorf("want the warning %q once, stderr:\n%s", warn, stderr)
		}
		if len(got) != len(oracle) || len(got) != 6 {
			t.Fatalf("rows for %d of the %d allocations", len(got), len(oracle))
		}
		for size, st := range got {
			if st != "" {
				t.Errorf("MALLOC of %d bytes has a Python stack on 3.9: %q", size, st)
			}
		}
	})
}
