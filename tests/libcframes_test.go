package tests

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"msmemscope/trace"
)

// TestLibcFramesKept: the blocks libc makes for a program (printf's stdio
// buffer, strdup, localtime's time-zone data) are attributed through libc's
// own frames: for each block valgrind finds alive at exit, the file:line of
// its stack's frames, innermost first up to main, are the ones msmemscope
// records for a block of that size (only the allocator's frame differs:
// valgrind's replacement malloc, msmemscope's hook, both left out).
func TestLibcFramesKept(t *testing.T) {
	bin := compile(t, "libcblocks.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--call-stack=c:12", bin)
	alive := map[uint64]*trace.Event{}
	for _, e := range readDump(t, readManifest(t, out).main(t).Dump) {
		if strings.Contains(e.CStack, "libmemscope.so") {
			t.Errorf("a frame of msmemscope's own in a C stack: %s", e.CStack) // SPEC §2.1
		}
		switch e.Kind {
		case trace.KindMalloc:
			alive[e.AllocID] = e
		case trace.KindFree:
			delete(alive, e.AllocID)
		}
	}
	lineOf := regexp.MustCompile(` ([^ ]+:\d+) \(`)
	var ours [][]string // file:line lists up to main, with the block's size first
	for _, e := range alive {
		var fl []string
		for _, f := range frames(e.CStack) {
			m := lineOf.FindStringSubmatch(f)
			if m == nil {
				break
			}
			fl = append(fl, m[1])
			if strings.HasPrefix(f, "main ") {
				break
			}
		}
		ours = append(ours, append([]string{strconv.FormatUint(e.Size, 10)}, fl...))
	}

	cmd := exec.Command("valgrind", "--leak-check=full", "--show-leak-kinds=all", "--run-libc-freeres=no",
		"--num-callers=12", bin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("valgrind: %v\n%s", err, stderr.String())
	}
	// "N bytes in 1 blocks are still reachable in loss record ..." then
	// "at/by 0xADDR: fn (file:line)", inlined frames repeating the address.
	head := regexp.MustCompile(`== ([\d,]+) bytes in 1 blocks are`)
	frame := regexp.MustCompile(`(?:at|by) (0x[0-9A-F]+): (\S+) \((?:[^)]*/)?([^ /)]+:\d+)\)`)
	var want [][]string
	var cur []string
	lastAddr := ""
	done := true
	for _, line := range strings.Split(stderr.String(), "\n") {
		if m := head.FindStringSubmatch(line); m != nil {
			if cur != nil {
				want = append(want, cur)
			}
			cur, lastAddr, done = []string{strings.ReplaceAll(m[1], ",", "")}, "", false
			continue
		}
		m := frame.FindStringSubmatch(line)
		if cur == nil || done || m == nil || m[1] == lastAddr {
			continue
		}
		lastAddr = m[1]
		cur = append(cur, m[3])
		done = m[2] == "main"
	}
	if cur != nil {
		want = append(want, cur)
	}
	if len(want) < 3 {
		t.Fatalf("valgrind listed %d blocks alive at exit, want at least 3:\n%s", len(want), stderr.String())
	}
	for _, w := range want {
		if !slices.ContainsFunc(ours, func(o []string) bool { return slices.Equal(o, w) }) {
			t.Errorf("valgrind: %s bytes at %q; msmemscope has no block of that size with that stack: %q", w[0], w[1:], ours)
		}
	}
	t.Logf("%d blocks libc made, stacks as valgrind's", len(want))
}

// TestReplacedAllocator: a program linked with an allocator that replaces
// glibc's (as jemalloc and tcmalloc do, defining glibc's own names
// __libc_malloc... too) keeps it: msmemscope forwards to the names' next
// definition, the allocator's (it went to glibc's, and the allocator's
// malloc_usable_size got a block that was not its: exit 99). glibc's names
// taken with dlsym from libc's handle are msmemscope's too: a block freed
// with __libc_free is not left live, one from __libc_malloc is recorded.
func TestReplacedAllocator(t *testing.T) {
	lib := compile(t, "fakealloc.c", "", "-shared", "-fPIC")
	bin := compile(t, "usefake.c", "", lib, "-Wl,-rpath,"+filepath.Dir(lib))
	if r := mustRun(t, 0, filepath.Join(t.TempDir(), "out"), bin); !strings.Contains(r.Stdout, "usable=100") {
		t.Errorf("the allocator's malloc_usable_size: %q", r.Stdout)
	}
	bin = compile(t, "libcdlsym.c", "", "-ldl")
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 0, out, bin)
	if strings.Contains(r.Stderr, "no recorded MALLOC precedes") {
		t.Errorf("FREEs without their MALLOC:\n%s", r.Stderr)
	}
	mallocs := 0
	live := liveHost(t, readManifest(t, out).main(t).Dump, func(e *trace.Event) {
		if e.Kind == trace.KindMalloc && ((e.Size >= 1000 && e.Size < 1005) || (e.Size >= 2000 && e.Size < 2005)) {
			mallocs++
		}
	})
	if mallocs != 10 {
		t.Errorf("%d MALLOCs of the ten blocks, want 10", mallocs)
	}
	for _, size := range live {
		if (size >= 1000 && size < 1005) || (size >= 2000 && size < 2005) {
			t.Errorf("a block of %d B is live at exit: the program freed every one", size)
		}
	}
}
