// Package tests holds msmemscope's end-to-end tests: C and C++ programs under
// progs/ are compiled into a temporary folder, run under the built CLI
// (build/bin/msmemscope, which preloads build/lib/libmemscope.so), and the
// files they leave are checked with the project's own readers.
//
// The build folder is $MSMEMSCOPE_BUILD (the Makefile's test target sets it
// after building); without it the tests run `make build` first, so that they
// never test stale binaries.
package tests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"msmemscope/spool"
	"msmemscope/trace"
)

var (
	repoRoot  string // the module root
	buildDir  string // holds bin/msmemscope and lib/libmemscope.so
	cliPath   string
	libDir    string
	progsDir  string // tests/progs
	binDir    string // compiled test programs, shared by every test
	setupFail string // why the build is unusable; every test fails with it
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = filepath.Dir(wd)
	progsDir = filepath.Join(wd, "progs")
	buildDir = os.Getenv("MSMEMSCOPE_BUILD")
	if buildDir == "" {
		buildDir = filepath.Join(repoRoot, "build")
		cmd := exec.Command("make", "--no-print-directory", "build")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			setupFail = fmt.Sprintf("make build failed: %v\n%s", err, out)
		}
	}
	cliPath = filepath.Join(buildDir, "bin", "msmemscope")
	libDir = filepath.Join(buildDir, "lib")
	for _, p := range []string{cliPath, filepath.Join(libDir, "libmemscope.so")} {
		if _, err := os.Stat(p); err != nil && setupFail == "" {
			setupFail = fmt.Sprintf("%s is missing: run `make build` (or set MSMEMSCOPE_BUILD): %v", p, err)
		}
	}
	binDir, err = os.MkdirTemp("", "msmemscope-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(binDir)
	return m.Run()
}

// needBuild fails the test when the CLI or library is missing.
func needBuild(t *testing.T) {
	t.Helper()
	if setupFail != "" {
		t.Fatal(setupFail)
	}
}

// ---------------------------------------------------------------------------
// Compiling the test programs

var (
	compileMu sync.Mutex
	compiled  = map[string]string{}
)

// linkMemscope are the flags that link a program against libmemscope.so (for
// the C API of include/msmemscope.h).
func linkMemscope() []string {
	return []string{"-L" + libDir, "-lmemscope", "-Wl,-rpath," + libDir}
}

// compile builds progs/src (or an absolute path) with gcc (.c) or g++ (.cpp)
// into the shared binary folder and returns the binary's path. The binary is
// named after the source (call stacks show it); flags beyond the defaults
// (-O0 -g -I include) are appended, and a variant name keeps differently
// built copies apart. Results are cached for the whole run.
func compile(t *testing.T, src, variant string, flags ...string) string {
	t.Helper()
	needBuild(t)
	if !filepath.IsAbs(src) {
		src = filepath.Join(progsDir, src)
	}
	base := strings.TrimSuffix(filepath.Base(src), filepath.Ext(src))
	out := filepath.Join(binDir, base)
	if variant != "" {
		out = filepath.Join(binDir, variant, base)
	}
	if strings.Contains(strings.Join(flags, " "), "-shared") {
		out += ".so"
	}
	compileMu.Lock()
	defer compileMu.Unlock()
	key := out + "\x00" + strings.Join(flags, "\x00")
	if p, ok := compiled[key]; ok {
		return p
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	cc := "gcc"
	if strings.HasSuffix(src, ".cpp") {
		cc = "g++"
	}
	args := append([]string{"-O0", "-g", "-Wall", "-I", filepath.Join(repoRoot, "include"), "-o", out, src}, flags...)
	cmd := exec.Command(cc, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", cc, strings.Join(args, " "), err, b)
	}
	compiled[key] = out
	return out
}

// ---------------------------------------------------------------------------
// Running the CLI

// result is one finished msmemscope command.
type result struct {
	Args           []string
	Code           int
	Stdout, Stderr string
	Elapsed        time.Duration
}

// cliEnv is the environment of the CLI: the test's, without anything that
// would change which library is used or where it writes.
func cliEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "LD_PRELOAD=") || strings.HasPrefix(kv, "MSMEMSCOPE_") || strings.HasPrefix(kv, "RANK=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// runCLI runs msmemscope with args and a timeout; it fails the test when the
// command hangs. dir is the working folder ("" for a fresh temporary one).
func runCLI(t *testing.T, timeout time.Duration, dir string, args ...string) *result {
	t.Helper()
	return runCLIEnv(t, timeout, dir, nil, args...)
}

// runCLIEnv is runCLI with extra environment variables (KEY=value).
func runCLIEnv(t *testing.T, timeout time.Duration, dir string, env []string, args ...string) *result {
	t.Helper()
	needBuild(t)
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliPath, args...)
	cmd.Dir = dir
	cmd.Env = cliEnv(env...)
	// Kill the whole process group on timeout, the traced program included.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := &result{Args: args, Stdout: so.String(), Stderr: se.String(), Elapsed: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("msmemscope %s hung: killed after %v\nstderr:\n%s", strings.Join(args, " "), timeout, r.Stderr)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("msmemscope %s died of signal %v\nstderr:\n%s", strings.Join(args, " "), ws.Signal(), r.Stderr)
		}
	default:
		t.Fatalf("msmemscope %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// started is a CLI run whose stdout the test reads line by line.
type started struct {
	cmd      *exec.Cmd
	lines    *bufio.Scanner
	stderr   bytes.Buffer
	timedOut atomic.Bool
}

// startCLI starts msmemscope with args in its own process group, stdout
// piped. The whole group -- the traced program too -- is killed after
// timeout and when the test ends, so a program left behind holding the pipe
// can never hang the test.
func startCLI(t *testing.T, timeout time.Duration, args ...string) *started {
	t.Helper()
	needBuild(t)
	s := &started{cmd: exec.Command(cliPath, args...)}
	s.cmd.Env = cliEnv()
	s.cmd.Stderr = &s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := s.cmd.Process.Pid
	timer := time.AfterFunc(timeout, func() {
		s.timedOut.Store(true)
		syscall.Kill(-pgid, syscall.SIGKILL)
	})
	t.Cleanup(func() {
		timer.Stop()
		syscall.Kill(-pgid, syscall.SIGKILL)
		s.cmd.Wait()
	})
	s.lines = bufio.NewScanner(out)
	return s
}

// wait reads the rest of stdout, waits for the CLI and returns its wait
// status; it fails the test if the timeout of startCLI struck.
func (s *started) wait(t *testing.T) syscall.WaitStatus {
	t.Helper()
	for s.lines.Scan() {
	}
	s.cmd.Wait()
	if s.timedOut.Load() {
		t.Fatalf("msmemscope %s hung and was killed\nstderr:\n%s", strings.Join(s.cmd.Args[1:], " "), s.stderr.String())
	}
	return s.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// mustRun runs msmemscope --output=out args... and requires exit code want.
func mustRun(t *testing.T, want int, out string, args ...string) *result {
	t.Helper()
	r := runCLI(t, 120*time.Second, "", append([]string{"--output=" + out}, args...)...)
	if r.Code != want {
		t.Fatalf("msmemscope %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.Args, " "), r.Code, want, r.Stdout, r.Stderr)
	}
	return r
}

// stderrLines returns the CLI's stderr lines, without the warning every run as
// root prints (SPEC §8).
func stderrLines(s string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if l == "" || strings.HasPrefix(l, "msmemscope: warning: running as root") {
			continue
		}
		out = append(out, l)
	}
	return out
}

// oneLineError requires the stderr of a refused command to be exactly one
// line starting "msmemscope: " and holding every string in want, with no
// sign of a crash.
func oneLineError(t *testing.T, r *result, want ...string) {
	t.Helper()
	lines := stderrLines(r.Stderr)
	if len(lines) != 1 {
		t.Fatalf("msmemscope %s: want one line on stderr, got %d:\n%s", strings.Join(r.Args, " "), len(lines), r.Stderr)
	}
	if !strings.HasPrefix(lines[0], "msmemscope: ") {
		t.Errorf("error line %q does not start with \"msmemscope: \"", lines[0])
	}
	for _, w := range want {
		if !strings.Contains(lines[0], w) {
			t.Errorf("error line %q does not name %q", lines[0], w)
		}
	}
	for _, bad := range []string{"panic", "goroutine", "SIGSEGV"} {
		if strings.Contains(r.Stderr, bad) {
			t.Errorf("stderr shows a crash (%q):\n%s", bad, r.Stderr)
		}
	}
}

// ---------------------------------------------------------------------------
// Output files

// manifest is run_{timestamp}.json (SPEC §2) and where it was found.
type manifest struct {
	spool.Manifest
	path string
}

type processInfo = spool.ManifestProcess

// readManifest reads the one run manifest in out.
func readManifest(t *testing.T, out string) *manifest {
	t.Helper()
	ms, _ := filepath.Glob(filepath.Join(out, "run_*.json"))
	if len(ms) != 1 {
		t.Fatalf("want one run manifest in %s, found %v", out, ms)
	}
	var m manifest
	readJSON(t, ms[0], &m)
	m.path = ms[0]
	if len(m.Processes) == 0 {
		t.Fatalf("%s lists no process", ms[0])
	}
	for _, p := range m.Processes {
		if p.Error != "" {
			t.Errorf("%s: process %d: %s", ms[0], p.Pid, p.Error)
		}
	}
	return &m
}

// main returns the manifest's main process.
func (m *manifest) main(t *testing.T) *processInfo {
	t.Helper()
	var found *processInfo
	for i := range m.Processes {
		if m.Processes[i].Main {
			if found != nil {
				t.Fatalf("%s: two main processes", m.path)
			}
			found = &m.Processes[i]
		}
	}
	if found == nil || found.Pid != m.MainPid {
		t.Fatalf("%s: no main process with pid %d", m.path, m.MainPid)
	}
	return found
}

// configJSON mirrors the fields of config.json the tests check.
type configJSON struct {
	Version                string            `json:"version"`
	Config                 json.RawMessage   `json:"config"`
	Pid                    int               `json:"pid"`
	Clock                  string            `json:"clock"`
	EventsRecorded         uint64            `json:"events_recorded"`
	EventsWritten          uint64            `json:"events_written"`
	EventsLost             *uint64           `json:"events_lost"`
	ForkedChildrenUntraced *int              `json:"forked_children_untraced"`
	Complete               bool              `json:"complete"`
	Ended                  string            `json:"ended"`
	Crash                  *spool.CrashMeta  `json:"crash"`
	Exec                   string            `json:"exec"`
	EventsNotWritten       map[string]uint64 `json:"events_not_written"`
	Order                  struct {
		Reordered      uint64 `json:"reordered"`
		UnpairedFrees  uint64 `json:"unpaired_frees"`
		LostFrees      uint64 `json:"lost_frees"`
		AmbiguousOrder uint64 `json:"ambiguous_order"`
	} `json:"order"`
	RotateLate          uint64 `json:"rotate_late"`
	EventsInDeletedLogs uint64 `json:"events_in_deleted_logs"`
}

func readConfig(t *testing.T, folder string) *configJSON {
	t.Helper()
	var c configJSON
	readJSON(t, filepath.Join(folder, "config.json"), &c)
	if c.EventsLost == nil || c.ForkedChildrenUntraced == nil {
		t.Fatalf("%s/config.json lacks events_lost or forked_children_untraced", folder)
	}
	return &c
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// onlyFile returns the one file matching pattern.
func onlyFile(t *testing.T, pattern string) string {
	t.Helper()
	ms, _ := filepath.Glob(pattern)
	if len(ms) != 1 {
		t.Fatalf("want one file matching %s, found %v", pattern, ms)
	}
	return ms[0]
}

// dumpOf returns the one dump CSV of a process folder.
func dumpOf(t *testing.T, folder string) string {
	t.Helper()
	return onlyFile(t, filepath.Join(folder, "dump", "memscope_dump_*.csv"))
}

// scanDump streams a dump through trace.Open, checking the order of
// SPEC §2.1 on every row: IDs strictly increasing (exactly 1, 2, 3… when
// consecutive is set: no --steps filter) and timestamps non-decreasing. It
// returns the number of rows; a dump without rows fails the test.
func scanDump(t *testing.T, path string, consecutive bool, fn func(e *trace.Event)) int {
	t.Helper()
	r, err := trace.Open(path, trace.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	n := 0
	var lastID, lastTS uint64
	for {
		e, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			break
		}
		n++
		if consecutive && e.ID != uint64(n) {
			t.Fatalf("%s: row %d has ID %d (want IDs 1..n in order)", path, n, e.ID)
		}
		if e.ID <= lastID {
			t.Fatalf("%s: row %d: ID %d after %d", path, n, e.ID, lastID)
		}
		if e.Timestamp < lastTS {
			t.Fatalf("%s: row ID %d: timestamp %d before the previous row's %d", path, e.ID, e.Timestamp, lastTS)
		}
		lastID, lastTS = e.ID, e.Timestamp
		if fn != nil {
			fn(e)
		}
	}
	if n == 0 {
		t.Fatalf("%s: no rows", path)
	}
	return n
}

// readDump reads a whole (small) dump with scanDump and numbers its steps as
// SPEC §3 does (msmemscope_step() calls if any, else "step start" ranges).
func readDump(t *testing.T, path string) []*trace.Event {
	t.Helper()
	var evs []*trace.Event
	scanDump(t, path, true, func(e *trace.Event) { evs = append(evs, e) })
	var st trace.StepTracker
	for _, e := range evs {
		if e.Kind == trace.KindSystem && e.Type == trace.TypeStep {
			st.UseStepCalls = true
		}
	}
	for _, e := range evs {
		st.Observe(e)
	}
	return evs
}

// heapTotals are the numbers of valgrind's heap summary.
type heapTotals struct {
	Allocs, Frees, Bytes    uint64 // "total heap usage: A allocs, F frees, B bytes allocated"
	InUseBytes, InUseBlocks uint64 // "in use at exit: X bytes in Y blocks"
}

func (h heapTotals) String() string {
	return fmt.Sprintf("%d allocs, %d frees, %d bytes allocated; in use at exit: %d bytes in %d blocks",
		h.Allocs, h.Frees, h.Bytes, h.InUseBytes, h.InUseBlocks)
}

// hostTotals computes valgrind's numbers from a dump's HOST rows: MALLOCs are
// allocations (their sizes summed), FREEs are frees, and MALLOCs never freed
// are in use at exit. Every FREE must close a live MALLOC of the same size.
func hostTotals(t *testing.T, evs []*trace.Event) heapTotals {
	t.Helper()
	var h heapTotals
	live := map[uint64]uint64{}
	for _, e := range evs {
		if e.Type != trace.TypeHost {
			continue
		}
		switch e.Kind {
		case trace.KindMalloc:
			if _, dup := live[e.AllocID]; dup {
				t.Fatalf("row %d: allocation_id %d is already live", e.ID, e.AllocID)
			}
			h.Allocs++
			h.Bytes += e.Size
			live[e.AllocID] = e.Size
		case trace.KindFree:
			sz, ok := live[e.AllocID]
			if !ok {
				t.Fatalf("row %d: FREE of allocation_id %d, which is not live", e.ID, e.AllocID)
			}
			if sz != e.Size {
				t.Fatalf("row %d: FREE of allocation_id %d says size %d, its MALLOC %d", e.ID, e.AllocID, e.Size, sz)
			}
			h.Frees++
			delete(live, e.AllocID)
		}
	}
	for _, sz := range live {
		h.InUseBlocks++
		h.InUseBytes += sz
	}
	if h.Allocs == 0 {
		t.Fatal("the dump has no HOST MALLOC row")
	}
	return h
}

// ---------------------------------------------------------------------------
// valgrind

var (
	vgInUse = regexp.MustCompile(`in use at exit: ([\d,]+) bytes in ([\d,]+) blocks`)
	vgTotal = regexp.MustCompile(`total heap usage: ([\d,]+) allocs, ([\d,]+) frees, ([\d,]+) bytes allocated`)
)

func atoiComma(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var (
	padsOnce sync.Once
	padsN    int
	padsErr  string
)

// tlsPads returns how many TLS modules msmemscope adds to a traced process
// (libmemscope.so itself, whose Go runtime has TLS, and libunwind.so.8 when it
// loads it): progs/tlsmods.c counts them natively and under msmemscope.
func tlsPads(t *testing.T) int {
	t.Helper()
	bin := compile(t, "tlsmods.c", "")
	padsOnce.Do(func() {
		count := func(out []byte) int {
			for _, l := range strings.Split(string(out), "\n") {
				if v, ok := strings.CutPrefix(l, "tls_modules "); ok {
					n, _ := strconv.Atoi(v)
					return n
				}
			}
			return -1
		}
		native, err := exec.Command(bin).Output()
		if err != nil || count(native) < 0 {
			padsErr = fmt.Sprintf("%s: %v: %q", bin, err, native)
			return
		}
		cmd := exec.Command(cliPath, "--output="+filepath.Join(binDir, "tlsmods-out"), bin)
		cmd.Env = cliEnv()
		traced, err := cmd.Output()
		if err != nil || count(traced) < count(native) {
			padsErr = fmt.Sprintf("msmemscope %s: %v: %q", bin, err, traced)
			return
		}
		padsN = count(traced) - count(native)
	})
	if padsErr != "" {
		t.Fatal(padsErr)
	}
	return padsN
}

// valgrindHeap runs bin under memcheck with --run-libc-freeres=no
// --run-cxx-freeres=no and TLS pads preloaded: progs/tlspad.c, once per TLS
// module msmemscope adds (tlsPads). glibc sizes each thread's DTV, a calloc
// counted in the heap totals, by the number of TLS modules; the pads give
// valgrind's run as many as msmemscope's, so the heaps are identical (16
// bytes per module per thread otherwise). It returns the root pid, each
// pid's heap summary (valgrind prints one per process: forked children too;
// with traceChildren, exec'd images) and the program's stdout.
func valgrindHeap(t *testing.T, traceChildren bool, bin string, args ...string) (int, map[int]heapTotals, string) {
	t.Helper()
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		t.Fatal("valgrind is not installed (make deps installs it)")
	}
	var pads []string
	for i := 0; i < tlsPads(t); i++ {
		pads = append(pads, compile(t, "tlspad.c", fmt.Sprintf("pad%d", i), "-shared", "-fPIC"))
	}
	t.Logf("valgrind runs with %d TLS pad(s) preloaded", len(pads))
	logs := t.TempDir()
	vargs := []string{"--tool=memcheck", "--run-libc-freeres=no", "--run-cxx-freeres=no",
		"--log-file=" + filepath.Join(logs, "vg.%p")}
	if traceChildren {
		vargs = append(vargs, "--trace-children=yes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, vg, append(append(vargs, bin), args...)...)
	cmd.Env = cliEnv("LD_PRELOAD=" + strings.Join(pads, ":"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("valgrind %s: %v\n%s", bin, err, stderr.String())
	}
	files, _ := filepath.Glob(filepath.Join(logs, "vg.*"))
	sums := map[int]heapTotals{}
	for _, f := range files {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(f), "vg."))
		if err != nil {
			t.Fatalf("unexpected valgrind log %s", f)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u, tot := vgInUse.FindSubmatch(b), vgTotal.FindSubmatch(b)
		if u == nil || tot == nil {
			t.Fatalf("valgrind log %s has no heap summary:\n%s", f, b)
		}
		sums[pid] = heapTotals{
			Allocs: atoiComma(t, string(tot[1])), Frees: atoiComma(t, string(tot[2])), Bytes: atoiComma(t, string(tot[3])),
			InUseBytes: atoiComma(t, string(u[1])), InUseBlocks: atoiComma(t, string(u[2])),
		}
	}
	if _, ok := sums[cmd.Process.Pid]; !ok {
		t.Fatalf("valgrind printed no summary for the root pid %d (logs: %v)", cmd.Process.Pid, files)
	}
	return cmd.Process.Pid, sums, stdout.String()
}

// ---------------------------------------------------------------------------
// Misc

// fileHash returns the SHA-256 of a file.
func fileHash(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// snapshot maps every regular file under dir to its hash.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			m[p] = fileHash(t, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// sourceLine returns the 1-based line of the only line of a test program's
// source holding marker.
func sourceLine(t *testing.T, path, marker string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line, found := 0, 0
	for n := 1; sc.Scan(); n++ {
		if strings.Contains(sc.Text(), marker) {
			line = n
			found++
		}
	}
	if found != 1 {
		t.Fatalf("%s: %d lines hold %q, want 1", path, found, marker)
	}
	return line
}

// frames splits a Call Stack(C) value.
func frames(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ";")
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[int]V) []int {
	ks := make([]int, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

// pythonPath returns the real Python interpreter: $PYTHON (the Makefile
// exports its venv's), else sys.executable of python3 — never the pyenv shim
// on PATH, a bash script that would become ~39 traced processes.
func pythonPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PYTHON"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	p := strings.TrimSpace(string(out))
	if err != nil || p == "" {
		t.Fatalf("no Python interpreter found (set $PYTHON): %v", err)
	}
	return p
}

// liveHost is the HOST blocks a dump leaves live (address to size), its
// MALLOCs and FREEs paired by address in row order; each HOST row is handed
// to each first, when it is not nil.
func liveHost(t *testing.T, dump string, each func(e *trace.Event)) map[uint64]uint64 {
	t.Helper()
	live := map[uint64]uint64{}
	scanDump(t, dump, true, func(e *trace.Event) {
		if e.Type != trace.TypeHost {
			return
		}
		if each != nil {
			each(e)
		}
		switch e.Kind {
		case trace.KindMalloc:
			live[e.Ptr] = e.Size
		case trace.KindFree:
			delete(live, e.Ptr)
		}
	})
	return live
}
