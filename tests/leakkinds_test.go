package tests

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"msmemscope/analyzer"
)

// kindTotals are the bytes and blocks of each leak kind, in valgrind's order
// (definitely, indirectly, possibly lost, still reachable).
type kindTotals [4]struct{ Bytes, Blocks uint64 }

// kindsDiffer says how msmemscope's leak kinds differ from valgrind's.
func kindsDiffer(got, want kindTotals) string {
	return fmt.Sprintf("leak kinds (definitely, indirectly, possibly lost, still reachable):\n msmemscope: %v\n valgrind:   %v", got, want)
}

var vgLeak = regexp.MustCompile(`(definitely lost|indirectly lost|possibly lost|still reachable): ([\d,]+) bytes in ([\d,]+) blocks`)

// valgrindLeaks runs bin under memcheck's full leak check and returns its
// leak summary (all zero when it says no leaks are possible).
func valgrindLeaks(t *testing.T, bin string) kindTotals {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "valgrind", "--tool=memcheck", "--leak-check=full", "--show-leak-kinds=all",
		"--run-libc-freeres=no", "--run-cxx-freeres=no", bin)
	// As many TLS modules as under msmemscope: a thread's DTV block has
	// the same size (see valgrindHeap).
	var pads []string
	for i := 0; i < tlsPads(t); i++ {
		pads = append(pads, compile(t, "tlspad.c", fmt.Sprintf("pad%d", i), "-shared", "-fPIC"))
	}
	cmd.Env = cliEnv("LD_PRELOAD=" + strings.Join(pads, ":"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("valgrind %s: %v\n%s", bin, err, out)
	}
	var k kindTotals
	ms := vgLeak.FindAllStringSubmatch(string(out), -1)
	if len(ms) == 0 && !strings.Contains(string(out), "no leaks are possible") {
		t.Fatalf("valgrind %s printed no leak summary:\n%s", bin, out)
	}
	for _, m := range ms {
		i := map[string]int{"definitely lost": 0, "indirectly lost": 1, "possibly lost": 2, "still reachable": 3}[m[1]]
		k[i].Bytes, k[i].Blocks = atoiComma(t, m[2]), atoiComma(t, m[3])
	}
	return k
}

// msmemscopeLeaks runs bin under msmemscope and totals its leaks report's
// EXIT rows by Kind.
// sameLeakKinds requires msmemscope's four leak totals of bin to be
// valgrind's, and returns both.
func sameLeakKinds(t *testing.T, bin string) (want, got kindTotals) {
	t.Helper()
	want = valgrindLeaks(t, bin)
	got, _ = msmemscopeLeaks(t, bin)
	if got != want {
		// valgrind's own answer varies now and then on a loaded machine
		// (lk_threads.c once called a dead thread's 1 MiB block possibly
		// lost, not definitely): its second opinion decides.
		again := valgrindLeaks(t, bin)
		t.Logf("valgrind asked again: %v (first %v)", again, want)
		want = again
	}
	if got != want {
		t.Error(kindsDiffer(got, want))
	} else {
		t.Logf("leak kinds: %v (both)", got)
	}
	return want, got
}

func msmemscopeLeaks(t *testing.T, bin string, opts ...string) (kindTotals, []leakRow) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, append(opts, bin)...)
	rows := readLeaks(t, readManifest(t, out).main(t).Folder)
	var k kindTotals
	for _, r := range rows {
		if r.kind != "EXIT" || r.typ == "MMAP" { // a mapping has no kind, as in valgrind
			continue
		}
		i := -1
		for j, name := range analyzer.LeakKinds {
			if r.leakKind == name {
				i = j
			}
		}
		if i < 0 {
			t.Fatalf("EXIT row of kind %q: %+v", r.leakKind, r)
		}
		k[i].Bytes += r.size
		k[i].Blocks += uint64(r.blocks)
	}
	return k, rows
}

// TestLeakKindsVsValgrind: the exit leaks' four kinds, bytes and blocks,
// equal memcheck's leak summary for programs that plant each kind (SPEC
// §5.1), at -O0 and at -O2 (where pointers live in registers, and exit()'s
// caller's callee-saved registers are roots).
func TestLeakKindsVsValgrind(t *testing.T) {
	needBuild(t)
	for _, prog := range []string{"lk_cycle.c", "lk_tree.c", "lk_globals.c", "lk_stack.c", "lk_hidden.c", "lk_cxx.cpp", "lk_threads.c", "lk_dlerror.c", "lk_reuse.c"} {
		for _, opt := range []string{"O0", "O2"} {
			t.Run(prog+"/"+opt, func(t *testing.T) {
				// -fno-builtin-malloc: -O2 would drop allocations it sees unused
				bin := compile(t, prog, opt, "-"+opt, "-fno-builtin-malloc", "-pthread")
				want, _ := sameLeakKinds(t, bin)
				if opt == "O0" && (prog == "lk_tree.c" || prog == "lk_cxx.cpp") {
					// Rotating logs: the live blocks come from the rotator.
					if rot, _ := msmemscopeLeaks(t, bin, "--log-mode=rotate", "--log-files=2"); rot != want {
						t.Errorf("with rotating logs: %v, valgrind %v", rot, want)
					}
				}
			})
		}
	}
}

// TestLeakKindsFollowedAsTheRunGoes: the live set the exit scan classifies
// is read as the run goes (blocks freed by another thread included), and
// the kinds still equal valgrind's. (The program clears its pointers to the
// blocks it frees: the lists' nodes reuse those addresses, and a stale
// pointer would make a list reachable natively, where valgrind, which keeps
// freed blocks out of reuse, calls it lost; README, leak kinds.)
func TestLeakKindsFollowedAsTheRunGoes(t *testing.T) {
	needBuild(t)
	bin := compile(t, "lk_follow.c", "", "-O0", "-pthread")
	want := valgrindLeaks(t, bin)
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 0, out, "--log-level=info", bin)
	m := regexp.MustCompile(`leak kinds: (\d+) of the spool's (\d+) bytes were read as the run went`).FindStringSubmatch(r.Stderr)
	if m == nil {
		t.Fatalf("no line on the live set followed:\n%s", r.Stderr)
	}
	if m[1] == "0" {
		t.Errorf("nothing was read before exit (%s bytes at exit): the live set was not followed", m[2])
	}
	var got kindTotals
	for _, row := range readLeaks(t, readManifest(t, out).main(t).Folder) {
		for j, name := range analyzer.LeakKinds {
			if row.kind == "EXIT" && row.typ != "MMAP" && row.leakKind == name {
				got[j].Bytes += row.size
				got[j].Blocks += uint64(row.blocks)
			}
		}
	}
	if got != want || want[0].Blocks < 5 || want[1].Blocks < 10 {
		t.Error(kindsDiffer(got, want))
	}
	t.Logf("%s of %s spool bytes read before exit; kinds %v", m[1], m[2], got)
}

// TestLeakKindsNotAfterExitUnderscore: a program that ends with _exit runs no
// exit handler: its blocks alive at exit have no kind (N/A), none invented.
func TestLeakKindsNotAfterExitUnderscore(t *testing.T) {
	bin := compile(t, "lk_quick.c", "")
	_, rows := msmemscopeLeaks0(t, bin)
	var blocks int
	for _, r := range rows {
		if r.kind == "EXIT" {
			blocks += r.blocks
			if r.leakKind != "N/A" {
				t.Errorf("EXIT row of kind %q after _exit: %+v", r.leakKind, r)
			}
		}
	}
	if blocks < 2 {
		t.Errorf("%d blocks alive at exit, want the program's 2 at least", blocks)
	}
}

// msmemscopeLeaks0 runs bin under msmemscope and returns its leak rows.
func msmemscopeLeaks0(t *testing.T, bin string) (string, []leakRow) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 0, out, bin)
	return r.Stderr, readLeaks(t, readManifest(t, out).main(t).Folder)
}

// TestLeakKindsThreadRegisters: the registers of threads still alive at exit
// are roots (valgrind reads every thread's registers). lk_regs.c's threads
// hold their blocks' only pointers in a register, one spinning in user space
// and one blocked in a system call: still reachable, as valgrind says; the
// malloc(20) dropped stays definitely lost.
func TestLeakKindsThreadRegisters(t *testing.T) {
	needBuild(t)
	for _, opt := range []string{"O0", "O2"} {
		t.Run(opt, func(t *testing.T) {
			bin := compile(t, "lk_regs.c", opt, "-"+opt, "-fno-builtin-malloc", "-pthread")
			_, got := sameLeakKinds(t, bin)
			// The program's own blocks, whatever valgrind says: the two held in
			// registers (4242 and 2424 bytes) reachable, the malloc(20) lost.
			if got[3].Bytes < 6666 || got[3].Blocks < 2 || got[0].Bytes != 20 || got[0].Blocks != 1 {
				t.Errorf("still reachable %+v (want the 6666 bytes in 2 blocks held in registers), definitely lost %+v (want 20 bytes in 1 block)", got[3], got[0])
			}
		})
	}
}

// TestLeakKindsThreadsFreeingNeighbours: four threads free each other's
// 800,000 blocks, then main loses a malloc(20): the kinds equal valgrind's
// in every one of several runs. The Go runtime's own mappings (its heap
// arenas past the first, what it keeps off its heap) hold copies of block
// addresses; read as roots, they made the lost block still reachable in
// about a third of the runs.
func TestLeakKindsThreadsFreeingNeighbours(t *testing.T) {
	needBuild(t)
	bin := compile(t, "lk_neighbours.c", "", "-O0", "-pthread")
	want := valgrindLeaks(t, bin)
	if want[0].Bytes != 20 || want[0].Blocks != 1 {
		t.Fatalf("valgrind: definitely lost %+v, want the malloc(20)", want[0])
	}
	for run := 1; run <= 6; run++ {
		if got, _ := msmemscopeLeaks(t, bin); got != want {
			t.Fatalf("run %d: %s", run, kindsDiffer(got, want))
		}
	}
}
