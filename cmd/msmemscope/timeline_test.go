package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// stdoutOf runs the CLI with args and returns its exit code and stdout.
func stdoutOf(t *testing.T, args []string) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	rc := run(args)
	os.Stdout = old
	w.Close()
	return rc, <-done
}

// --timeline reads every input kind spool.Open reads: a dump CSV, a dump
// DB, and a capture folder holding only dump files, all alike.
func TestTimelineCLIDumpFiles(t *testing.T) {
	dir := t.TempDir()
	csv := filepath.Join(dir, "dump.csv")
	db := filepath.Join(dir, "dump.db")
	steps(t, csv, map[int]uint64{3: 8192}, "")
	steps(t, db, map[int]uint64{3: 8192}, "")
	capDir := filepath.Join(dir, "out", "msmemscope_1_20260101000000")
	os.MkdirAll(filepath.Join(capDir, "dump"), 0o750)
	steps(t, filepath.Join(capDir, "dump", "memscope_dump_20260101000000.db"), map[int]uint64{3: 8192}, "")
	var want string
	for i, in := range []string{csv, db, capDir, filepath.Dir(capDir)} {
		rc, out := stdoutOf(t, []string{"--timeline", "--input=" + in, "--interval-ms=1"})
		if rc != 0 {
			t.Fatalf("--timeline --input=%s: exit %d\n%s", in, rc, out)
		}
		if i == 0 {
			want = out
			// Every block of steps() stays allocated: the peak is the total,
			// five 4096-byte outputs and 8192 more.
			if !strings.Contains(out, "28672") {
				t.Fatalf("--timeline --input=%s: no peak of 28672 bytes:\n%s", in, out)
			}
			continue
		}
		if out != want {
			t.Errorf("--timeline --input=%s differs from the CSV's:\n%s\nCSV:\n%s", in, out, want)
		}
	}
	// An input that is not a dump: a usage error.
	bad := filepath.Join(dir, "notes.txt")
	os.WriteFile(bad, []byte("hello\n"), 0o640)
	if rc, _ := stdoutOf(t, []string{"--timeline", "--input=" + bad}); rc != 2 {
		t.Errorf("--timeline --input=%s: exit %d, want 2", bad, rc)
	}
}
