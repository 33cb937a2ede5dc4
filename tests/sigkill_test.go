package tests

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"msmemscope/trace"
)

// Constants of progs/steady.c.
const (
	steadyBase = 50000
	steadyN    = 4000
)

// TestSIGKILLSpoolRecovered: a program allocating a known sequence (block k
// has size 50000+k, one a millisecond) is killed with SIGKILL half-way. Its
// spool, turned into a CSV by `msmemscope --input=DIR`, holds rows in order
// (IDs 1..n, timestamps non-decreasing) and every allocation up to shortly
// before the kill, as a prefix of the known sequence (SPEC §7).
func TestSIGKILLSpoolRecovered(t *testing.T) {
	bin := compile(t, "steady.c", "")
	out := filepath.Join(t.TempDir(), "out")
	s := startCLI(t, 120*time.Second, "--output="+out, bin)

	type report struct {
		k  int
		at time.Time
	}
	var reports []report
	var killedAt time.Time
	pid := 0
	for s.lines.Scan() {
		line := s.lines.Text()
		if p, ok := strings.CutPrefix(line, "pid "); ok {
			pid, _ = strconv.Atoi(p)
			continue
		}
		k, err := strconv.Atoi(line)
		if err != nil {
			t.Fatalf("unexpected line %q from the program", line)
		}
		reports = append(reports, report{k, time.Now()})
		if k == steadyN/2 && killedAt.IsZero() {
			if pid <= 0 || pid == s.cmd.Process.Pid {
				t.Fatalf("the program reported pid %d (the CLI is %d)", pid, s.cmd.Process.Pid)
			}
			// Kill the traced program itself, not the CLI.
			killedAt = time.Now()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	ws := s.wait(t)
	if killedAt.IsZero() {
		t.Fatalf("the program never reached k=%d; stderr:\n%s", steadyN/2, s.stderr.String())
	}
	if ws.Signaled() || ws.ExitStatus() != 128+int(syscall.SIGKILL) {
		t.Errorf("msmemscope ended with %v, want exit %d (128+SIGKILL)", s.cmd.ProcessState, 128+int(syscall.SIGKILL))
	}
	// The newest k reported at least 100 ms before the kill: it and all
	// before it must be in the spool.
	safe, last := -1, reports[len(reports)-1].k
	for _, r := range reports {
		if r.at.Before(killedAt.Add(-100 * time.Millisecond)) {
			safe = r.k
		}
	}
	if safe < 100 {
		t.Fatalf("only %d allocations were reported 100 ms before the kill", safe+1)
	}

	m := readManifest(t, out)
	mp := m.main(t)
	if mp.Complete || mp.ExitStatus == nil || *mp.ExitStatus != 137 {
		t.Errorf("manifest: complete %v, exit status %v; want false, 137", mp.Complete, mp.ExitStatus)
	}
	first := mp.Dump
	firstHash := fileHash(t, first)

	// Offline conversion of the killed run's process folder.
	r := runCLI(t, 120*time.Second, "", "--input="+mp.Folder)
	if r.Code != 0 {
		t.Fatalf("msmemscope --input: exit %d\n%s", r.Code, r.Stderr)
	}
	if !strings.Contains(r.Stderr, "incomplete") {
		t.Errorf("msmemscope --input should say the capture is incomplete:\n%s", r.Stderr)
	}
	dumps, _ := filepath.Glob(filepath.Join(mp.Folder, "dump", "memscope_dump_*.csv"))
	var second string
	for _, d := range dumps {
		if d != first {
			second = d
		}
	}
	if len(dumps) != 2 || second == "" {
		t.Fatalf("want the CLI's dump and a new one, found %v", dumps)
	}
	if !strings.Contains(r.Stderr, second) {
		t.Errorf("msmemscope --input does not name the file it wrote (%s):\n%s", second, r.Stderr)
	}

	next := 0 // the next k expected
	freed := map[uint64]bool{}
	sizeOf := map[uint64]uint64{}
	rows := scanDump(t, second, true, func(e *trace.Event) {
		if e.Kind == trace.KindSystem && e.Type == trace.TypeProcessExit {
			t.Errorf("row %d: PROCESS_EXIT in the dump of a killed process", e.ID)
		}
		if e.Type != trace.TypeHost {
			return
		}
		switch e.Kind {
		case trace.KindMalloc:
			if e.Size < steadyBase || e.Size >= steadyBase+steadyN {
				return
			}
			if k := int(e.Size - steadyBase); k != next {
				t.Fatalf("row %d: block k=%d where k=%d was expected (not a prefix of the sequence)", e.ID, k, next)
			}
			sizeOf[e.AllocID] = e.Size
			next++
		case trace.KindFree:
			if sz, ok := sizeOf[e.AllocID]; ok {
				freed[sz-steadyBase] = true
			}
		}
	})
	got := next - 1 // the last k in the dump
	t.Logf("killed at k=%d (last reported %d); %d rows; dump holds k=0..%d; 100 ms before the kill: k=%d",
		steadyN/2, last, rows, got, safe)
	if got < safe {
		t.Errorf("the dump ends at k=%d: allocations up to k=%d, reported 100 ms before the kill, are missing", got, safe)
	}
	if got > last+1 {
		t.Errorf("the dump holds k=%d, but the program was killed after k=%d", got, last)
	}
	// steady.c frees block k-1 when k%4 == 3.
	for k := 3; k <= safe; k += 4 {
		if !freed[uint64(k-1)] {
			t.Errorf("the FREE of block k=%d (done before k=%d) is missing", k-1, k)
			break
		}
	}
	// The CLI converted the same spool when its program died: the same rows.
	if fileHash(t, second) != firstHash {
		t.Errorf("the --input dump differs from the CLI's dump of the same spool")
	}
	if _, err := os.Stat(first); err != nil {
		t.Error(err)
	}
}
