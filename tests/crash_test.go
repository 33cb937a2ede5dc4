package tests

import (
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"msmemscope/spool"
	"msmemscope/trace"
)

// Constants of progs/crash.c: block k has size crashBase + 1000*k.
const (
	crashBase = 12345
	crashN    = 5
)

// crashBlocks checks that a dump holds crash.c's blocks, each once, with
// their exact sizes.
func crashBlocks(t *testing.T, dump string) {
	t.Helper()
	seen := map[uint64]int{}
	scanDump(t, dump, true, func(e *trace.Event) {
		if e.Kind == trace.KindMalloc && e.Type == trace.TypeHost && e.Size >= crashBase && e.Size < crashBase+1000*crashN && (e.Size-crashBase)%1000 == 0 {
			seen[e.Size]++
		}
	})
	for k := 0; k < crashN; k++ {
		if n := seen[uint64(crashBase+1000*k)]; n != 1 {
			t.Errorf("%s: the MALLOC of %d bytes (block %d, allocated just before the crash) appears %d times, want 1", dump, crashBase+1000*k, k, n)
		}
	}
}

// pyBlocks checks that a dump holds the three bytearrays of 777,777 bytes
// (blocks of 777,778) that the Python scripts of these tests make.
func pyBlocks(t *testing.T, dump string) {
	t.Helper()
	n := 0
	scanDump(t, dump, true, func(e *trace.Event) {
		if e.Kind == trace.KindMalloc && e.Type == trace.TypeHost && e.Size == 777778 {
			n++
		}
	})
	if n != 3 {
		t.Errorf("%d MALLOCs of 777,778 bytes in the dump, want 3", n)
	}
}

// TestCrashSignals: a program that allocates five blocks and crashes at
// once, with no pause (raise(SIGSEGV), a null pointer write, abort(), glibc
// aborting in free on a double free, a stack overflow). The CLI exits with the program's status, says it crashed, and
// the capture holds every MALLOC: the library's crash handler drained the
// rings before the process died, waiting for the capture folder when the
// crash came before the engine had made it. config.json says the capture is
// not complete and that it ended by a crash.
func TestCrashSignals(t *testing.T) {
	bin := compile(t, "crash.c", "")
	for _, c := range []struct {
		mode string
		sig  syscall.Signal
	}{
		{"segv", syscall.SIGSEGV},
		{"fault", syscall.SIGSEGV},
		{"abort", syscall.SIGABRT},
		{"double", syscall.SIGABRT},
		{"stack", syscall.SIGSEGV},
	} {
		t.Run(c.mode, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			r := runCLI(t, 60*time.Second, "", "--output="+out, bin, c.mode)
			if r.Code != 128+int(c.sig) {
				t.Fatalf("msmemscope: exit %d, want %d (128+%v)\n%s", r.Code, 128+int(c.sig), c.sig, r.Stderr)
			}
			if strings.Contains(r.Stderr, "collector had started") || strings.Contains(r.Stderr, "no capture") {
				t.Errorf("the CLI found no capture:\n%s", r.Stderr)
			}
			if !strings.Contains(r.Stderr, "crashed with signal "+strconv.Itoa(int(c.sig))) {
				t.Errorf("the CLI does not say the program crashed with signal %d:\n%s", int(c.sig), r.Stderr)
			}
			m := readManifest(t, out)
			mp := m.main(t)
			if mp.Complete || mp.Ended != spool.EndedCrash || mp.ExitStatus == nil || *mp.ExitStatus != 128+int(c.sig) {
				t.Errorf("manifest: complete %v, ended %q, exit status %v; want false, %q, %d", mp.Complete, mp.Ended, mp.ExitStatus, spool.EndedCrash, 128+int(c.sig))
			}
			cfg := readConfig(t, mp.Folder)
			if cfg.Complete || cfg.Ended != spool.EndedCrash || cfg.Crash == nil || cfg.Crash.Signal != int(c.sig) || !cfg.Crash.Drained {
				t.Errorf("config.json: complete %v, ended %q, crash %+v; want false, %q, signal %d drained", cfg.Complete, cfg.Ended, cfg.Crash, spool.EndedCrash, int(c.sig))
			}
			crashBlocks(t, mp.Dump)
		})
	}
}

// TestCrashOwnHandler: a program with its own SIGSEGV handler (sigaction
// with SA_SIGINFO, or signal(), installed before it allocates) that prints a
// line and exits 3. Its handler still runs after msmemscope's (the line,
// exit 3), and the capture, ended by that exit, holds its events.
func TestCrashOwnHandler(t *testing.T) {
	bin := compile(t, "crash.c", "")
	for _, mode := range []string{"own", "signal"} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			r := runCLI(t, 60*time.Second, "", "--output="+out, bin, mode)
			if r.Code != 3 || !strings.Contains(r.Stdout, "handled 11") {
				t.Fatalf("msmemscope: exit %d, stdout %q; want 3 and the program's handler's line\n%s", r.Code, r.Stdout, r.Stderr)
			}
			mp := readManifest(t, out).main(t)
			if cfg := readConfig(t, mp.Folder); cfg.Ended != spool.EndedExit {
				t.Errorf("config.json: ended %q, want %q (the program's handler exited)", cfg.Ended, spool.EndedExit)
			}
			crashBlocks(t, mp.Dump)
		})
	}
}

// TestQuickExit: a program that ends with _exit, _Exit or quick_exit right
// after allocating (no exit handlers run; from a SIGTERM handler too), and a
// Python script that ends with os._exit: the CLI exits with its status and
// the capture holds every MALLOC (msmemscope's _exit drains the rings
// first); config.json says it ended by _exit, the capture complete.
func TestQuickExit(t *testing.T) {
	check := func(t *testing.T, out string, r *result) *processInfo {
		t.Helper()
		if r.Code != 7 {
			t.Fatalf("msmemscope: exit %d, want 7\n%s", r.Code, r.Stderr)
		}
		mp := readManifest(t, out).main(t)
		cfg := readConfig(t, mp.Folder)
		if !cfg.Complete || cfg.Ended != spool.EndedQuick || cfg.Crash == nil || cfg.Crash.ExitStatus == nil || *cfg.Crash.ExitStatus != 7 || !cfg.Crash.Drained {
			t.Errorf("config.json: complete %v, ended %q, crash %+v; want true, %q, status 7, drained", cfg.Complete, cfg.Ended, cfg.Crash, spool.EndedQuick)
		}
		return mp
	}
	bin := compile(t, "crash.c", "")
	for _, mode := range []string{"_exit", "_Exit", "term", "quick_exit"} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			r := runCLI(t, 60*time.Second, "", "--output="+out, bin, mode)
			dump := check(t, out, r).Dump
			crashBlocks(t, dump)
			if mode != "quick_exit" {
				return
			}
			// Its at_quick_exit handler freed the first block before
			// msmemscope's drained (libc's quick_exit ends with its own
			// _exit: the capture was lost).
			var first uint64
			frees := 0
			scanDump(t, dump, true, func(e *trace.Event) {
				switch {
				case e.Kind == trace.KindMalloc && e.Type == trace.TypeHost && e.Size == crashBase:
					first = e.Ptr
				case e.Kind == trace.KindFree && e.Type == trace.TypeHost && first != 0 && e.Ptr == first:
					frees++
				}
			})
			if frees != 1 {
				t.Errorf("the FREE of the first block by the at_quick_exit handler: %d, want 1", frees)
			}
		})
	}
	t.Run("python", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		r := runCLI(t, 60*time.Second, "", "--output="+out, pythonPath(t), "-c",
			"import os\nx = [bytearray(777777) for i in range(3)]\nos._exit(7)")
		mp := check(t, out, r)
		pyBlocks(t, mp.Dump)
	})
}

// TestEndingSignals: SIGTERM, SIGINT and SIGHUP raised right after the
// program allocated (and SIGUSR1, and a SIGPIPE from a write to a closed
// pipe), with no handler of its own: it dies of the signal
// (the CLI exits 128+N) and the capture holds every MALLOC (msmemscope's
// handler drained first; "ended": "signal"). Ignored, the signal is
// ignored: set by the program, or inherited (then msmemscope installs no
// handler, so that it stays ignored across exec). Python's SIGINT still
// raises KeyboardInterrupt, and its exit by SIGINT keeps the capture.
func TestEndingSignals(t *testing.T) {
	bin := compile(t, "crash.c", "")
	for _, c := range []struct {
		mode string
		sig  syscall.Signal
	}{{"sigterm", syscall.SIGTERM}, {"sigint", syscall.SIGINT}, {"sighup", syscall.SIGHUP}, {"unignterm", syscall.SIGTERM},
		{"sigusr1", syscall.SIGUSR1}, {"sigpipe", syscall.SIGPIPE}} {
		t.Run(c.mode, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			r := runCLI(t, 60*time.Second, "", "--output="+out, bin, c.mode)
			if r.Code != 128+int(c.sig) || !strings.Contains(r.Stderr, "completed in msmemscope's handler") {
				t.Fatalf("msmemscope: exit %d, want %d, and the line that the capture was completed\n%s", r.Code, 128+int(c.sig), r.Stderr)
			}
			mp := readManifest(t, out).main(t)
			if cfg := readConfig(t, mp.Folder); cfg.Ended != spool.EndedSignal || cfg.Crash == nil || cfg.Crash.Signal != int(c.sig) || !cfg.Crash.Drained {
				t.Errorf("config.json: ended %q, crash %+v; want %q, signal %d, drained", cfg.Ended, cfg.Crash, spool.EndedSignal, int(c.sig))
			}
			crashBlocks(t, mp.Dump)
		})
	}
	// The program's own handler calls exit(): the exit's work runs from the
	// alternate signal stack ours ran it on (it crashed, 10 runs in 10,
	// while Go's preemption signals could land there).
	t.Run("handler_exit", func(t *testing.T) {
		bin := compile(t, "termexit.c", "")
		for i := 0; i < 5; i++ {
			out := filepath.Join(t.TempDir(), "out")
			r := runCLI(t, 60*time.Second, "", "--output="+out, bin)
			if r.Code != 3 {
				t.Fatalf("run %d: msmemscope: exit %d, want 3 (the handler's exit)\n%s", i, r.Code, r.Stderr)
			}
			mp := readManifest(t, out).main(t)
			if cfg := readConfig(t, mp.Folder); cfg.Ended != spool.EndedExit {
				t.Errorf("config.json: ended %q, want %q", cfg.Ended, spool.EndedExit)
			}
			crashBlocks(t, mp.Dump)
		}
	})
	t.Run("ignored", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		r := runCLI(t, 60*time.Second, "", "--output="+out, bin, "ignterm")
		if r.Code != 0 {
			t.Fatalf("msmemscope: exit %d, want 0 (SIGTERM ignored)\n%s", r.Code, r.Stderr)
		}
		r = runCLI(t, 60*time.Second, "", "--output="+filepath.Join(t.TempDir(), "out2"), "sh", "-c", "trap '' HUP; exec "+bin+" sighup")
		if r.Code != 128+int(syscall.SIGSEGV) {
			t.Fatalf("msmemscope: exit %d, want 139 (SIGHUP ignored from the start: the program goes on to its SIGSEGV)\n%s", r.Code, r.Stderr)
		}
		// The CLI itself started ignoring SIGHUP (nohup): so does the program.
		cmd := exec.Command("sh", "-c", "trap '' HUP; exec "+cliPath+" --output="+filepath.Join(t.TempDir(), "out3")+" "+bin+" sighup")
		cmd.Env = cliEnv()
		said, _ := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 128+int(syscall.SIGSEGV) {
			t.Fatalf("nohup msmemscope: exit %d, want 139 (SIGHUP ignored, as the CLI was started)\n%s", code, said)
		}
	})
	t.Run("python", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		r := runCLI(t, 60*time.Second, "", "--output="+out, pythonPath(t), "-c",
			"import os, signal, time\nx = [bytearray(777777) for i in range(3)]\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)")
		if r.Code != 128+int(syscall.SIGINT) || !strings.Contains(r.Stderr, "KeyboardInterrupt") {
			t.Fatalf("msmemscope: exit %d, want 130 after Python's KeyboardInterrupt\n%s", r.Code, r.Stderr)
		}
		mp := readManifest(t, out).main(t)
		pyBlocks(t, mp.Dump)
		// A SIGINT while Python blocks in read(): the call ends with EINTR
		// (our handler takes Python's flags, without SA_RESTART), so the
		// KeyboardInterrupt comes at once, not after the read.
		r = runCLI(t, 30*time.Second, "", "--output="+filepath.Join(t.TempDir(), "out2"), pythonPath(t), "-c",
			"import os, signal, threading\nr, w = os.pipe()\nthreading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\nos.read(r, 1)")
		if r.Code != 128+int(syscall.SIGINT) || !strings.Contains(r.Stderr, "KeyboardInterrupt") {
			t.Fatalf("msmemscope: exit %d, want 130 after Python's KeyboardInterrupt in read()\n%s", r.Code, r.Stderr)
		}
	})
}

// TestCrashPythonFaulthandler: Python's faulthandler installs its SIGSEGV
// handler with sigaction after msmemscope's; on a crash it still prints the
// Python traceback, restores the previous handler and raises the signal
// again, and the process dies of SIGSEGV with every allocation in the
// capture (three bytearrays of 777,777 bytes: blocks of 777,778).
func TestCrashPythonFaulthandler(t *testing.T) {
	py := pythonPath(t)
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, py, "-X", "faulthandler", "-c",
		"import ctypes\nx = [bytearray(777777) for i in range(3)]\nctypes.string_at(0)")
	if r.Code != 128+int(syscall.SIGSEGV) || !strings.Contains(r.Stderr, "Fatal Python error: Segmentation fault") {
		t.Fatalf("msmemscope: exit %d, want 139 and faulthandler's report\n%s", r.Code, r.Stderr)
	}
	mp := readManifest(t, out).main(t)
	if cfg := readConfig(t, mp.Folder); cfg.Ended != spool.EndedCrash || cfg.Crash == nil || !cfg.Crash.Drained {
		t.Errorf("config.json: ended %q, crash %+v; want %q, drained", cfg.Ended, cfg.Crash, spool.EndedCrash)
	}
	pyBlocks(t, mp.Dump)
}

// TestSIGKILLBound: progs/steady.c allocating its known sequence every
// 0.2 ms is killed with SIGKILL at a random moment 20 to 400 ms after the
// CLI started, a few times. Every allocation the program reported at least
// 100 ms before the kill is in the dump (README: the drain moves every
// thread's published events out within ~30 ms).
func TestSIGKILLBound(t *testing.T) {
	bin := compile(t, "steady.c", "")
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	for i := 0; i < 5; i++ {
		delay := time.Duration(20+rng.Intn(381)) * time.Millisecond
		t.Run(delay.String(), func(t *testing.T) { killAfter(t, bin, delay) })
	}
}

func killAfter(t *testing.T, bin string, delay time.Duration) {
	out := filepath.Join(t.TempDir(), "out")
	start := time.Now()
	s := startCLI(t, 60*time.Second, "--output="+out, bin, "200")
	type report struct {
		k  int
		at time.Time
	}
	var (
		mu       sync.Mutex
		killedAt time.Time
		reports  []report
		timer    *time.Timer
	)
	for s.lines.Scan() {
		line := s.lines.Text()
		if p, ok := strings.CutPrefix(line, "pid "); ok {
			pid, _ := strconv.Atoi(p)
			if pid <= 0 || pid == s.cmd.Process.Pid {
				t.Fatalf("the program reported pid %d (the CLI is %d)", pid, s.cmd.Process.Pid)
			}
			timer = time.AfterFunc(time.Until(start.Add(delay)), func() {
				mu.Lock()
				killedAt = time.Now()
				mu.Unlock()
				syscall.Kill(pid, syscall.SIGKILL)
			})
			continue
		}
		k, err := strconv.Atoi(line)
		if err != nil {
			t.Fatalf("unexpected line %q from the program", line)
		}
		reports = append(reports, report{k, time.Now()})
	}
	ws := s.wait(t)
	if timer != nil {
		timer.Stop()
	}
	mu.Lock()
	kt := killedAt
	mu.Unlock()
	if kt.IsZero() {
		t.Fatalf("the program ended before the kill (%v after the start); stderr:\n%s", delay, s.stderr.String())
	}
	if ws.ExitStatus() != 128+int(syscall.SIGKILL) {
		t.Errorf("msmemscope ended with %v, want exit %d (128+SIGKILL)", s.cmd.ProcessState, 128+int(syscall.SIGKILL))
	}
	safe, last := -1, -1
	for _, r := range reports {
		if r.at.Before(kt.Add(-100 * time.Millisecond)) {
			safe = r.k
		}
		last = r.k
	}
	caps, _ := filepath.Glob(filepath.Join(out, "msmemscope_*"))
	if len(caps) == 0 || safe < 0 {
		if safe >= 0 {
			t.Fatalf("no capture, though k=0..%d were reported 100 ms before the kill; stderr:\n%s", safe, s.stderr.String())
		}
		t.Logf("killed %v after the start: nothing was reported 100 ms before (%d captures)", delay, len(caps))
		return
	}
	mp := readManifest(t, out).main(t)
	next := 0
	scanDump(t, mp.Dump, true, func(e *trace.Event) {
		if e.Kind != trace.KindMalloc || e.Type != trace.TypeHost || e.Size < steadyBase || e.Size >= steadyBase+steadyN {
			return
		}
		if k := int(e.Size - steadyBase); k != next {
			t.Fatalf("row %d: block k=%d where k=%d was expected (not a prefix of the sequence)", e.ID, k, next)
		}
		next++
	})
	t.Logf("killed %v after the start (last reported k=%d); dump holds k=0..%d; 100 ms before the kill: k=%d", delay, last, next-1, safe)
	if next-1 < safe {
		t.Errorf("the dump ends at k=%d: allocations up to k=%d, reported 100 ms before the kill, are missing", next-1, safe)
	}
	if _, err := os.Stat(mp.Dump); err != nil {
		t.Error(err)
	}
}

// TestCrashRotatingLogs: with rotating logs, whose batches a goroutine
// compresses and writes while the drain takes the next, the crash handler
// waits until every batch drained is in its log: the logs, converted after
// the crash, hold every MALLOC of a program that crashes right after
// allocating flat out.
func TestCrashRotatingLogs(t *testing.T) {
	bin := compile(t, "crash.c", "")
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, "--log-mode=rotate", "--log-files=4", "--log-file-mb=1", bin, "segv", "2000000")
	if r.Code != 128+int(syscall.SIGSEGV) {
		t.Fatalf("msmemscope: exit %d, want %d\n%s", r.Code, 128+int(syscall.SIGSEGV), r.Stderr)
	}
	mp := readManifest(t, out).main(t)
	if mp.Complete || mp.Ended != spool.EndedCrash {
		t.Errorf("manifest: complete %v, ended %q; want false, %q", mp.Complete, mp.Ended, spool.EndedCrash)
	}
	c := runCLI(t, 60*time.Second, "", "--input="+mp.Folder)
	if c.Code != 0 {
		t.Fatalf("--input=%s: exit %d\n%s", mp.Folder, c.Code, c.Stderr)
	}
	dumps, _ := filepath.Glob(filepath.Join(mp.Folder, spool.DumpDir, "memscope_dump_*.csv"))
	if len(dumps) != 1 {
		t.Fatalf("dumps %v", dumps)
	}
	crashBlocks(t, dumps[0])
	n := 0
	scanDump(t, dumps[0], true, func(e *trace.Event) {
		if e.Kind == trace.KindMalloc && e.Size == 4093 {
			n++
		}
	})
	if n != 2000000 {
		t.Errorf("%d MALLOCs of 4093 bytes in the logs, want 2000000", n)
	}
}

// A run killed with SIGKILL is said to hold all but its last ~100 ms; with
// rotating logs, which a program recording flat out outruns, the CLI says
// what more it may lack (the events waiting in the threads' rings).
func TestSIGKILLMessage(t *testing.T) {
	bin := compile(t, "steady.c", "")
	for _, rotate := range []bool{false, true} {
		args := []string{"--output=" + filepath.Join(t.TempDir(), "out")}
		if rotate {
			args = append(args, "--log-mode=rotate")
		}
		s := startCLI(t, 60*time.Second, append(args, bin, "200")...)
		for s.lines.Scan() {
			if p, ok := strings.CutPrefix(s.lines.Text(), "pid "); ok {
				pid, _ := strconv.Atoi(p)
				time.AfterFunc(100*time.Millisecond, func() { syscall.Kill(pid, syscall.SIGKILL) })
			}
		}
		s.wait(t)
		msg := s.stderr.String()
		if !strings.Contains(msg, "all but the last ~100 ms") || strings.Contains(msg, "rotating logs what waited") != rotate {
			t.Errorf("rotate %v: the CLI said:\n%s", rotate, msg)
		}
	}
}
