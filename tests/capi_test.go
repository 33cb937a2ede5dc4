package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCAPIForkedChild: every call of include/msmemscope.h answers in the
// parent (data calls with the one reply shape) and is refused in a forked
// child (-1, 0 or NULL) without entering Go, which would hang or crash there.
func TestCAPIForkedChild(t *testing.T) {
	bin := compile(t, "forkapi.c", "", linkMemscope()...)
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 0, out, bin)
	for _, want := range []string{"parent ok", "child ok"} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("no %q in the output:\n%s\n%s", want, r.Stdout, r.Stderr)
		}
	}
}

// TestCAPIForkedChildCoversHeader: forkapi.c's child calls every function
// the headers declare, so a call added to include/msmemscope.h without its
// fork check fails TestCAPIForkedChild.
func TestCAPIForkedChildCoversHeader(t *testing.T) {
	prog, err := os.ReadFile(filepath.Join(repoRoot, "tests", "progs", "forkapi.c"))
	if err != nil {
		t.Fatal(err)
	}
	_, child, ok := strings.Cut(string(prog), "if (pid == 0) {")
	if !ok {
		t.Fatal("forkapi.c: no child section")
	}
	decl := regexp.MustCompile(`(?m)^(?:char \*|int |void |uint64_t )(\w+)\(`)
	n := 0
	for _, h := range []string{"msmemscope.h", filepath.Join("mstx", "ms_tools_ext.h")} {
		b, err := os.ReadFile(filepath.Join(repoRoot, "include", h))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			n++
			if !strings.Contains(child, m[1]+"(") {
				t.Errorf("%s declares %s, which forkapi.c never calls in its forked child", h, m[1])
			}
		}
	}
	if n < 20 {
		t.Fatalf("found only %d declarations in the headers", n)
	}
}
