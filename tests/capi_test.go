package tests

import (
	"path/filepath"
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
