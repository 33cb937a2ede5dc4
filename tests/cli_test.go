package tests

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"msmemscope/trace"
)

// TestCLIExitCode: the program's exit code is forwarded (3 -> 3), and the
// final stderr line says where the results are: the output folder and the run
// manifest, which exists and records the same exit status.
func TestCLIExitCode(t *testing.T) {
	bin := compile(t, "behave.c", "")
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 3, out, bin, "exit", "3")
	m := readManifest(t, out)
	if m.ExitStatus != 3 {
		t.Errorf("manifest exit_status %d, want 3", m.ExitStatus)
	}
	if mp := m.main(t); mp.ExitStatus == nil || *mp.ExitStatus != 3 || !mp.Complete {
		t.Errorf("main process: exit status %v, complete %v; want 3, true", mp.ExitStatus, mp.Complete)
	}
	lines := stderrLines(r.Stderr)
	final := lines[len(lines)-1]
	if !strings.Contains(final, out) || !strings.Contains(final, m.path) {
		t.Errorf("final stderr line %q does not name the output folder %s and manifest %s", final, out, m.path)
	}
}

// TestCLISignalExitCode: a program killed by a signal makes msmemscope exit
// 128+N (SIGUSR1: 138); its capture is converted, incomplete, with the block
// it allocated 300 ms before dying.
func TestCLISignalExitCode(t *testing.T) {
	bin := compile(t, "behave.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 128+int(syscall.SIGUSR1), out, bin, "signal", "10")
	m := readManifest(t, out)
	if m.ExitStatus != 138 {
		t.Errorf("manifest exit_status %d, want 138", m.ExitStatus)
	}
	mp := m.main(t)
	if mp.Complete {
		t.Error("a process killed by a signal cannot have a complete capture")
	}
	found := false
	scanDump(t, mp.Dump, true, func(e *trace.Event) {
		found = found || (e.Kind == trace.KindMalloc && e.Size == 1234)
	})
	if !found {
		t.Error("the block allocated 300 ms before the signal (1234 bytes) is not in the dump")
	}

	// Killed at once, before the collector's Go runtime has started (it
	// starts a few ms after main): the code is still forwarded and the
	// CLI says why nothing was captured, in one line.
	out2 := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 138, out2, bin, "early-signal", "10")
	if ms, _ := filepath.Glob(filepath.Join(out2, "run_*.json")); len(ms) == 0 {
		last := stderrLines(r.Stderr)
		if len(last) == 0 || !strings.Contains(last[len(last)-1], "signal 10") {
			t.Errorf("no capture, and the last stderr line does not say the program died of signal 10:\n%s", r.Stderr)
		}
	}
}

// TestCLIForwardsSIGTERM: SIGTERM sent to msmemscope reaches the program,
// which traps it and exits 42; msmemscope itself survives, exits 42, and the
// capture is complete (it holds the block allocated after the signal).
func TestCLIForwardsSIGTERM(t *testing.T) {
	bin := compile(t, "behave.c", "")
	out := filepath.Join(t.TempDir(), "out")
	s := startCLI(t, 60*time.Second, "--output="+out, bin, "trap")
	if !s.lines.Scan() || s.lines.Text() != "ready" {
		t.Fatalf("the program did not get ready: %q\n%s", s.lines.Text(), s.stderr.String())
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ws := s.wait(t)
	if ws.Signaled() || ws.ExitStatus() != 42 {
		t.Fatalf("msmemscope: %v, want exit 42 from the program's SIGTERM handler\n%s", s.cmd.ProcessState, s.stderr.String())
	}
	m := readManifest(t, out)
	mp := m.main(t)
	if !mp.Complete {
		t.Error("the capture should be complete: the program exited normally")
	}
	found := false
	scanDump(t, mp.Dump, true, func(e *trace.Event) {
		found = found || (e.Kind == trace.KindMalloc && e.Size == 4321)
	})
	if !found {
		t.Error("the block allocated after SIGTERM (4321 bytes) is not in the dump")
	}
}

// TestSignalBlockedByProgramStaysPending: a program that blocks SIGTERM and
// takes it with sigwait() (the usual graceful-shutdown pattern) gets it under
// msmemscope as it does alone: the signal, forwarded while the program's only
// thread blocks it, must stay pending for that thread, not be delivered to
// one of the collector's internal threads (where its default action kills
// the process: exit 143 instead of 42).
func TestSignalBlockedByProgramStaysPending(t *testing.T) {
	bin := compile(t, "behave.c", "")
	// Without msmemscope: the pattern works.
	plain := exec.Command(bin, "sigwait")
	stdout, err := plain.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "ready" {
		t.Fatalf("the program did not get ready: %q", sc.Text())
	}
	plain.Process.Signal(syscall.SIGTERM)
	for sc.Scan() {
	}
	if plain.Wait(); plain.ProcessState.ExitCode() != 42 {
		t.Fatalf("alone, the program ended with %v, want exit 42", plain.ProcessState)
	}
	out := filepath.Join(t.TempDir(), "out")
	s := startCLI(t, 60*time.Second, "--output="+out, bin, "sigwait")
	if !s.lines.Scan() || s.lines.Text() != "ready" {
		t.Fatalf("the program did not get ready: %q\n%s", s.lines.Text(), s.stderr.String())
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws := s.wait(t); ws.Signaled() || ws.ExitStatus() != 42 {
		t.Fatalf("under msmemscope: %v, want exit 42 (the program's sigwait got SIGTERM)\n%s", s.cmd.ProcessState, s.stderr.String())
	}
}

// TestCLIRefusesStaticProgram: a statically linked program is refused with
// exit 2 and one line, before anything is written or run.
func TestCLIRefusesStaticProgram(t *testing.T) {
	bin := compile(t, "behave.c", "static", "-static")
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 2, out, bin, "exit", "0")
	oneLineError(t, r, bin, "statically linked")
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("the output folder was created for a refused program (%v)", err)
	}
}

// TestCLIScriptWithoutShebang: a script with no "#!" line runs under
// /bin/sh, as a shell or execvp runs it (it failed to start, exit 1), its
// status kept and the shell traced.
func TestCLIScriptWithoutShebang(t *testing.T) {
	script := filepath.Join(t.TempDir(), "plain.sh")
	if err := os.WriteFile(script, []byte("echo ran \"$1\"\nexit 3\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 3, out, script, "arg1")
	if !strings.Contains(r.Stdout, "ran arg1") {
		t.Errorf("the script's output: %q, want \"ran arg1\"", r.Stdout)
	}
	if m := readManifest(t, out).main(t); m.Events == 0 {
		t.Errorf("no event recorded from the shell that ran the script")
	}
}

// TestCLIBadOptions spot-checks option errors (the full table is in
// cmd/msmemscope/cli): exit 2, one line naming the option and the value, and
// the program never starts.
// TestCLILogFilesWithoutRotate: --log-files and --log-file-mb mean nothing
// in full mode: the run goes on and says so in one line (it said nothing).
func TestCLILogFilesWithoutRotate(t *testing.T) {
	needBuild(t)
	const warn = "--log-files and --log-file-mb apply with --log-mode=rotate only"
	for _, c := range []struct {
		opts []string
		warn bool
	}{
		{[]string{"--log-files=5"}, true},
		{[]string{"--log-file-mb=4"}, true},
		{[]string{"--log-mode=rotate", "--log-files=5"}, false},
		{nil, false},
	} {
		dir := t.TempDir()
		args := append([]string{"--output=" + filepath.Join(dir, "out")}, c.opts...)
		r := runCLI(t, 30*time.Second, dir, append(args, "/bin/true")...)
		if r.Code != 0 || strings.Count(r.Stderr, warn) != map[bool]int{true: 1, false: 0}[c.warn] {
			t.Errorf("%v: exit %d, stderr:\n%s\nwant exit 0 and the warning %v", c.opts, r.Code, r.Stderr, c.warn)
		}
	}
}

// TestCLICollectionOptionsOffline: options that shape a collection, given
// to --input, were silently ignored: one line names them, and the
// conversion goes on.
func TestCLICollectionOptionsOffline(t *testing.T) {
	bin := compile(t, "single.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	capture := readManifest(t, out).main(t).Folder
	r := mustRun(t, 0, filepath.Join(t.TempDir(), "again"), "--call-stack=c:4", "--log-mode=rotate", "--analysis=leaks", "--input="+capture)
	const warn = "--call-stack, --log-mode apply when a program is run: reading a capture (--input), they change nothing"
	if strings.Count(r.Stderr, warn) != 1 {
		t.Errorf("want the warning once:\n%s", r.Stderr)
	}
	if r = mustRun(t, 0, filepath.Join(t.TempDir(), "again"), "--analysis=leaks", "--input="+capture); strings.Contains(r.Stderr, "apply when a program is run") {
		t.Errorf("a warning without such options:\n%s", r.Stderr)
	}
}

func TestCLIBadOptions(t *testing.T) {
	needBuild(t)
	cases := []struct {
		opt  string
		want []string
	}{
		{"--level=bogus", []string{"--level", "bogus"}},
		{"--bogus-option", []string{"--bogus-option"}},
		{"--call-stack=c:1001", []string{"--call-stack", "1001"}},
		{"--steps=1,2,3,4,5,6", []string{"--steps"}},
		{"--device=", []string{"--device"}},
		{"--collect-mode=later", []string{"--collect-mode", "later"}},
	}
	for _, c := range cases {
		t.Run(strings.TrimLeft(c.opt, "-"), func(t *testing.T) {
			dir := t.TempDir()
			marker := filepath.Join(dir, "ran")
			out := filepath.Join(dir, "out")
			r := runCLI(t, 30*time.Second, dir, "--output="+out, c.opt, "/usr/bin/touch", marker)
			if r.Code != 2 {
				t.Fatalf("exit %d, want 2\n%s", r.Code, r.Stderr)
			}
			oneLineError(t, r, c.want...)
			if _, err := os.Stat(marker); err == nil {
				t.Error("the program ran despite the bad option")
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("the output folder was created despite the bad option")
			}
		})
	}
}

// TestCLIBashScript: `msmemscope bash script.sh` traces bash and every program
// the script execs, each into its own folder, all listed in the manifest with
// bash as their parent.
func TestCLIBashScript(t *testing.T) {
	prog := compile(t, "single.c", "")
	dir := t.TempDir()
	script := filepath.Join(dir, "script.sh")
	if err := os.WriteFile(script, []byte("\"$1\"\n\"$1\" a b\n/bin/true\necho done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	r := mustRun(t, 0, out, "bash", script, prog)
	if strings.TrimSpace(r.Stdout) != "done" {
		t.Errorf("stdout %q, want \"done\"", r.Stdout)
	}
	m := readManifest(t, out)
	mp := m.main(t)
	if filepath.Base(mp.Cmdline[0]) != "bash" {
		t.Errorf("main process is %q, want bash", mp.Cmdline)
	}
	want := [][]string{{prog}, {prog, "a", "b"}, {"/bin/true"}}
	if len(m.Processes) != 1+len(want) {
		t.Errorf("manifest lists %d processes, want bash and %d programs: %+v", len(m.Processes), len(want), m.Processes)
	}
	for _, w := range want {
		var p *processInfo
		for i := range m.Processes {
			if slices.Equal(m.Processes[i].Cmdline, w) {
				p = &m.Processes[i]
			}
		}
		if p == nil {
			t.Errorf("manifest lacks %q", w)
			continue
		}
		if p.Ppid != mp.Pid || p.Main || !p.Complete {
			t.Errorf("%q: ppid %d (bash is %d), main %v, complete %v", w, p.Ppid, mp.Pid, p.Main, p.Complete)
		}
		if w[0] == prog {
			// single.c makes 1001 allocations whatever its arguments.
			if h := hostTotals(t, readDump(t, p.Dump)); h.Allocs != 1001 {
				t.Errorf("%q: %d HOST allocations, want 1001", w, h.Allocs)
			}
		}
	}
}

// TestCLIHelp: --help lists every option of SPEC §1.1 with its default.
func TestCLIHelp(t *testing.T) {
	r := runCLI(t, 30*time.Second, "", "--help")
	if r.Code != 0 {
		t.Fatalf("--help: exit %d", r.Code)
	}
	help := r.Stdout
	defaults := map[string]string{
		"--device":       "cpu,cuda",
		"--level":        "op",
		"--events":       "alloc,free,launch",
		"--call-stack":   "",
		"--collect-mode": "immediate",
		"--analysis":     "leaks",
		"--steps":        "",
		"--watch":        "",
		"--data-format":  "csv",
		"--output":       "./memscopeDumpResults",
		"--log-level":    "warn",
		"--log-mode":     "full",
		"--log-files":    "10",
		"--log-file-mb":  "100",
		"--input":        "",
		"--interval-ms":  "100",
	}
	// Each option's entry runs from its name to the next option's.
	names := []string{"-h, --help", "-v, --version"}
	for n := range defaults {
		names = append(names, n+"=")
	}
	names = append(names, "--compare", "--timeline")
	for _, n := range names {
		i := strings.Index(help, "  "+n)
		if i < 0 {
			t.Errorf("--help does not list %s", n)
			continue
		}
		entry := help[i+2:]
		if j := strings.Index(entry[len(n):], "\n  -"); j >= 0 {
			entry = entry[:len(n)+j]
		}
		d, valued := defaults[strings.TrimSuffix(n, "=")]
		if !valued {
			continue
		}
		if !strings.Contains(entry, "default") {
			t.Errorf("--help entry of %s gives no default:\n%s", n, entry)
		} else if d != "" && !strings.Contains(entry, "(default: "+d+")") {
			t.Errorf("--help entry of %s does not give the default %q:\n%s", n, d, entry)
		}
	}
	if !strings.Contains(help, "default 50") {
		t.Error("--help does not give the default call stack depth (50)")
	}
}

// TestMainPthreadExit: a program whose main calls pthread_exit ends when its
// last thread does, exit code 0, its capture whole (it hung: msmemscope's
// own threads kept the process alive).
// main's cleanup handler and thread-specific destructor run first, as bare
// (they were skipped: msmemscope called exit in main's pthread_exit), with
// a thread left to wait for and without; and a thread whose own destructor
// frees after the last thread ended is waited for.
func TestMainPthreadExit(t *testing.T) {
	bin := compile(t, "mainexit.c", "", "-pthread")
	for _, args := range [][]string{{bin}, {bin, "alone"}, {bin, "slow"}} {
		out := filepath.Join(t.TempDir(), "out")
		r := runCLI(t, 30*time.Second, "", append([]string{"--output=" + out}, args...)...)
		if r.Code != 0 {
			t.Fatalf("%q: exit %d, want 0\n%s", args, r.Code, r.Stderr)
		}
		m := readManifest(t, out).main(t)
		if c := readConfig(t, m.Folder); c.Ended != "exit" {
			t.Errorf("%q: config.json: ended %q, want exit", args, c.Ended)
		}
		for _, size := range liveHost(t, m.Dump, nil) {
			if size == 123 || size == 789 || size == 4567 {
				t.Errorf("%q: the block of %d B main's destructors free is live at exit", args, size)
			}
		}
	}
}
