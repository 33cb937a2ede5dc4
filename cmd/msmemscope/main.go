// Command msmemscope runs a program with libmemscope.so preloaded, then turns
// each traced process's spool into the dump, config.json and analysis reports
// (SPEC §1.1, §2). With --input it works offline on an existing capture.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/config"
	"msmemscope/internal/logx"
	"msmemscope/internal/version"
	"msmemscope/spool"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	inv, err := cli.Parse(args)
	if err != nil {
		return usage(err)
	}
	logx.SetLevel(inv.Config.LogLevel)
	switch inv.Mode {
	case cli.ModeHelp:
		fmt.Print(cli.Help())
		return 0
	case cli.ModeVersion:
		fmt.Println("msmemscope", version.Version)
		return 0
	case cli.ModeRun:
		return runProgram(inv)
	}
	warnCollectionOnly(inv)
	switch inv.Mode {
	case cli.ModeOffline:
		return offline(inv)
	case cli.ModeTimeline:
		return timeline(inv)
	case cli.ModeCompare:
		return compare(inv)
	default:
		return usage(fmt.Errorf("--%s is not available in this version", inv.Mode))
	}
}

// usage prints a one-line error and returns the usage exit code.
// collectionOnly are the options that shape a collection: read offline,
// a capture keeps what its run asked for.
var collectionOnly = []string{"device", "level", "events", "call-stack", "collect-mode", "watch", "log-mode", "log-files", "log-file-mb"}

// warnCollectionOnly says, in one line, which of them an offline command
// was given: they were silently ignored.
func warnCollectionOnly(inv *cli.Invocation) {
	var given []string
	for _, o := range collectionOnly {
		if inv.Set[o] {
			given = append(given, "--"+o)
		}
	}
	if len(given) > 0 {
		logx.Warnf("%s apply when a program is run: reading a capture (--input), they change nothing", strings.Join(given, ", "))
	}
}

func usage(err error) int {
	fmt.Fprintf(os.Stderr, "msmemscope: %v\n", err)
	return 2
}

func fail(err error) int {
	fmt.Fprintf(os.Stderr, "msmemscope: %v\n", err)
	return 1
}

// libraryPath finds libmemscope.so: $MSMEMSCOPE_LIB, then beside the CLI,
// then ../lib beside it (the installed layout).
// nvtxInjection names the library NVTX hands its calls to.
const nvtxInjection = "NVTX_INJECTION64_PATH"

func libraryPath() (string, error) {
	if p := os.Getenv("MSMEMSCOPE_LIB"); p != "" {
		return filepath.Abs(p)
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	exe, _ = filepath.EvalSymlinks(exe)
	dir := filepath.Dir(exe)
	for _, p := range []string{filepath.Join(dir, "libmemscope.so"), filepath.Join(dir, "..", "lib", "libmemscope.so")} {
		if _, err := os.Stat(p); err == nil {
			return filepath.Abs(p)
		}
	}
	return "", fmt.Errorf("libmemscope.so not found beside %s (set MSMEMSCOPE_LIB)", exe)
}

// sourceStartup is the startup hook folder of the checkout the CLI was
// built from (the Makefile sets it): a build folder outside the checkout
// (make BUILD=/elsewhere) still finds it.
var sourceStartup string

// pythonStartupDir finds the Python package's startup hook folder: in the
// installed package (msmemscope/lib/libmemscope.so beside msmemscope/_startup),
// in a source checkout (build/lib beside python/msmemscope), or in the
// checkout the CLI was built from; "" if none.
func pythonStartupDir(lib string) string {
	libDir := filepath.Dir(lib)
	for _, d := range []string{filepath.Join(libDir, "..", "_startup"), filepath.Join(libDir, "..", "..", "python", "msmemscope", "_startup"), sourceStartup} {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "sitecustomize.py")); err == nil {
			if abs, err := filepath.Abs(d); err == nil {
				return abs
			}
		}
	}
	return ""
}

func newRunID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func runProgram(inv *cli.Invocation) int {
	cfg := inv.Config
	prog, err := cli.CheckProgram(inv.Program[0])
	if err != nil {
		return usage(err)
	}
	_, statErr := os.Stat(cfg.Output)
	if err := ensureOutput(cfg.Output); err != nil {
		return usage(err)
	}
	lib, err := libraryPath()
	if err != nil {
		return fail(err)
	}
	if os.Geteuid() == 0 {
		logx.Warnf("running as root; output is still written with modes 0750/0640 and the same path checks")
	}
	if cfg.LogMode != "rotate" && (inv.Set["log-files"] || inv.Set["log-file-mb"]) {
		logx.Warnf("--log-files and --log-file-mb apply with --log-mode=rotate only: this run keeps one whole spool (--log-mode=%s)", cfg.LogMode)
	}
	logx.Infof("tracing %s: output %s, options %s", strings.Join(inv.Program, " "), cfg.Output, cfg.Encode())
	runID := newRunID()
	env := os.Environ()
	preload := lib
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		preload = lib + ":" + old
	}
	env = setEnv(env, "LD_PRELOAD", preload)
	env = setEnv(env, config.EnvConfig, cfg.Encode())
	env = setEnv(env, config.EnvRunID, runID)
	env = setEnv(env, "MSMEMSCOPE_HOOK", cfg.Hook().Env())
	// NVTX ranges and marks become MSTX rows: NVTX loads this library as its
	// injection (libmemscope/nvtx.c). Another tool's (Nsight Systems') is
	// left in place.
	if old, ok := os.LookupEnv(nvtxInjection); ok && old != lib {
		logx.Warnf("%s is set (%s), another tool's: NVTX ranges are left to it and make no MSTX row", nvtxInjection, old)
	} else {
		env = setEnv(env, nvtxInjection, lib)
	}
	if dir := pythonStartupDir(lib); dir != "" {
		// A Python program gets its PyTorch collection without importing
		// msmemscope (python/msmemscope/_startup/sitecustomize.py).
		path := dir
		if old := os.Getenv("PYTHONPATH"); old != "" {
			path += ":" + old
		}
		env = setEnv(env, "PYTHONPATH", path)
		env = setEnv(env, config.EnvPyStartup, dir)
	}

	cmd := exec.Command(prog, inv.Program[1:]...)
	cmd.Args[0] = inv.Program[0]
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 4)
	// Forwarded to the program; SIGHUP or SIGINT the CLI was started
	// ignoring (nohup, a background job's SIGINT) stays ignored, for the
	// program too: a handler here would make it the default again in the
	// program. (Go's runtime keeps an inherited ignore for those two only.)
	for _, s := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			signal.Notify(sigs, s)
		}
	}
	err = cmd.Start()
	if errors.Is(err, syscall.ENOEXEC) {
		// Neither ELF nor "#!" (cli.CheckProgram lets it by): run by
		// /bin/sh, as execvp and the shells do.
		cmd = exec.Command("/bin/sh", append([]string{prog}, inv.Program[1:]...)...)
		cmd.Args[0] = "sh"
		cmd.Env = env
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		err = cmd.Start()
	}
	if err != nil {
		return fail(fmt.Errorf("cannot start %s: %v", inv.Program[0], err))
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	werr := cmd.Wait()
	signal.Stop(sigs)
	code := exitCode(cmd.ProcessState, werr)

	var sig syscall.Signal
	if ps := cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			sig = ws.Signal()
		}
	}
	man, manPath, err := collectRun(cfg, runID, cmd.Process.Pid, inv.Program, code, sig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "msmemscope: %v\n", err)
		if code == 0 {
			code = 1
		}
		return code
	}
	if sig != 0 {
		fmt.Fprintf(os.Stderr, "msmemscope: %s\n", howEnded(sig, man, cfg.LogMode == "rotate"))
	}
	results := filepath.Dir(manPath)
	if results != cfg.Output && os.IsNotExist(statErr) {
		os.Remove(cfg.Output) // made for this run, left empty: the program chose another output
	}
	fmt.Fprintf(os.Stderr, "msmemscope: %d traced process(es); results in %s (run manifest %s)\n",
		len(man.Processes), results, manPath)
	return code
}

// howEnded says what a signal that ended the main program left in its
// capture: everything (a crash signal, drained by the library's handler) or
// all but the last moments (SIGKILL, say; with rotating logs, whose drain
// a program recording flat out outruns, more).
func howEnded(sig syscall.Signal, man *spool.Manifest, rotating bool) string {
	ended := ""
	for _, p := range man.Processes {
		if p.ExitStatus != nil { // the main program's last image (it may have exec'd)
			ended = p.Ended
		}
	}
	what := fmt.Sprintf("signal %d (%s, %v)", int(sig), unix.SignalName(sig), sig)
	switch ended {
	case spool.EndedCrash:
		return "the program crashed with " + what + "; its capture was completed in msmemscope's crash handler and holds every event recorded before the crash"
	case spool.EndedExit:
		return "the program was ended by " + what + " after its own exit path had completed the capture"
	case spool.EndedSignal:
		return "the program was ended by " + what + "; its capture was completed in msmemscope's handler and holds every event recorded before it"
	}
	rings := ""
	if rotating {
		rings = ", and with rotating logs what waited in the threads' rings: up to 4 MiB of events a thread, ~0.3 s of a program allocating flat out"
	}
	if spool.CrashSignal(sig) {
		return "the program crashed with " + what + ", and its capture could not be completed (the handler was replaced, or the crash came inside msmemscope): it holds the events up to the drain's last pass (at most ~100 ms before the crash" + rings + ")"
	}
	lost := "all but the last ~100 ms" + rings
	return "the program was killed by " + what + "; its capture holds the events up to the drain's last pass (" + lost + "; a thread idle since may lack its last event)"
}

func exitCode(ps *os.ProcessState, err error) int {
	if ps == nil {
		return 1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return 1
	}
	return ps.ExitCode()
}

func setEnv(env []string, key, val string) []string {
	prefix := key + "="
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, prefix) {
			out = append(out, kv)
		}
	}
	return append(out, prefix+val)
}
