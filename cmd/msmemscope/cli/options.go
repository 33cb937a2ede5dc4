// Package cli parses msmemscope's command line (SPEC §1.1) into an
// Invocation; package main runs it. It is its own package so that it can be
// tested alone.
package cli

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"msmemscope/config"
)

// Mode is what an invocation asks for.
type Mode int

const (
	ModeRun      Mode = iota // run a program under collection
	ModeOffline              // --input=DIR without --compare/--timeline: turn a capture into files, run analyses
	ModeCompare              // --compare --input=A,B
	ModeTimeline             // --timeline --input=DIR
	ModeHelp                 // -h, --help
	ModeVersion              // -v, --version
)

func (m Mode) String() string {
	switch m {
	case ModeRun:
		return "run"
	case ModeOffline:
		return "offline"
	case ModeCompare:
		return "compare"
	case ModeTimeline:
		return "timeline"
	case ModeHelp:
		return "help"
	case ModeVersion:
		return "version"
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// DefaultIntervalMs is --interval-ms when not given.
const DefaultIntervalMs = 100

// MaxIntervalMs bounds --interval-ms (one hour).
const MaxIntervalMs = 3600000

// Invocation is a parsed command line.
type Invocation struct {
	Mode Mode
	// Config is the effective configuration: Finish applied, Output absolute.
	// For ModeHelp and ModeVersion it is config.Default() untouched.
	Config  config.Config
	Program []string // ModeRun: the program and its arguments, as given
	Inputs  []string // --input paths, as given (ModeOffline, ModeTimeline: 1; ModeCompare: 2)
	// IntervalMs is --interval-ms (ModeTimeline), DefaultIntervalMs when absent.
	IntervalMs int
	// Set holds the long names ("device", "compare", "interval-ms", ...) of
	// the options given explicitly on the command line.
	Set map[string]bool
}

// UsageError is a command line msmemscope refuses. Msg is one line; main
// prints "msmemscope: "+Msg and exits 2. Err, when set, is the underlying
// error (a *config.OptionError for an option's rule).
type UsageError struct {
	Msg string
	Err error
}

func (e *UsageError) Error() string { return e.Msg }
func (e *UsageError) Unwrap() error { return e.Err }

func usage(format string, a ...any) *UsageError {
	return &UsageError{Msg: fmt.Sprintf(format, a...)}
}

func wrap(err error) *UsageError {
	return &UsageError{Msg: err.Error(), Err: err}
}

// option is one valued option of the command line.
type option struct {
	name, arg, help string
	def             func(c config.Config) string // default shown by Help
}

// valued lists the options taking a value, config options first (SPEC §1.1's
// order), then --input and --interval-ms.
var valued = []option{
	{"device", "LIST", "cpu (host heap), cuda (all GPUs), cuda:{id} (id in [0,31]); npu, npu:{id} are aliases of cuda, cuda:{id}; comma-separated, never empty",
		func(c config.Config) string { return strings.Join(c.Devices, ",") }},
	{"level", "op|kernel", "op (alias 0): framework operator launches; kernel (alias 1): device kernel launches",
		func(c config.Config) string { return c.Level }},
	{"events", "LIST", "alloc, free, launch, access, traceback; alloc implies free and vice versa, access implies both; empty = none",
		func(c config.Config) string { return eventsString(c.Events) }},
	{"call-stack", "LIST", "python[:depth], c[:depth] with depth in [0,1000] (default 50); empty = no stacks",
		func(c config.Config) string { return "no stacks" }},
	{"collect-mode", "immediate|deferred", "immediate: collect from program start; deferred: off until the first start()",
		func(c config.Config) string { return c.CollectMode }},
	{"analysis", "LIST", "leaks, inefficient, decompose; empty = none. leaks/decompose imply events alloc,free; inefficient implies alloc,free,access,launch",
		func(c config.Config) string { return strings.Join(c.Analysis, ",") }},
	{"steps", "LIST", "up to 5 step ids (integers >= 1): only those steps' rows are written; empty = all steps",
		func(c config.Config) string { return "all steps" }},
	{"watch", "[start[:out{id}],]end[,full-content]", "memory-block watch between two operators; name#N selects the N-th launch",
		func(c config.Config) string { return "off" }},
	{"data-format", "csv|db", "output file format; db = SQLite",
		func(c config.Config) string { return c.DataFormat }},
	{"output", "DIR", "output folder, made absolute before the program starts; at most 4096 bytes",
		func(c config.Config) string { return c.Output }},
	{"log-level", "info|warn|error", "log level",
		func(c config.Config) string { return c.LogLevel }},
	{"log-mode", "full|rotate", "rotate: keep only the newest --log-files spool files of about --log-file-mb MiB each",
		func(c config.Config) string { return c.LogMode }},
	{"log-files", "N", "spool files kept with --log-mode=rotate, in [1,1000]",
		func(c config.Config) string { return strconv.Itoa(c.LogFiles) }},
	{"log-file-mb", "M", "size of a spool file in MiB with --log-mode=rotate, in [1,10240]",
		func(c config.Config) string { return strconv.Itoa(c.LogFileMB) }},
	{"export", "LIST", "html (a self-contained report: memory over time, flame graphs, top sites, leaks), pprof (a heap profile for go tool pprof), perfetto (a trace ui.perfetto.dev opens), memory_viz (a PyTorch memory snapshot pytorch.org/memory_viz opens), comma-separated: also written into the capture's export/ folder; empty = none",
		func(c config.Config) string { return "none" }},
	{"input", "A[,B]", "a capture folder, or a memscope_dump CSV/DB file, to process offline; two with --compare; each path at most 4096 bytes",
		func(c config.Config) string { return "" }},
	{"interval-ms", "N", "interval of --timeline in milliseconds, in [1,3600000]",
		func(c config.Config) string { return strconv.Itoa(DefaultIntervalMs) }},
}

func eventsString(e config.Events) string {
	var s []string
	for _, x := range []struct {
		on   bool
		name string
	}{{e.Alloc, "alloc"}, {e.Free, "free"}, {e.Launch, "launch"}, {e.Access, "access"}, {e.Traceback, "traceback"}} {
		if x.on {
			s = append(s, x.name)
		}
	}
	return strings.Join(s, ",")
}

// given is one valued option as it appeared, in command-line order.
type given struct{ name, value string }

// recorder is the pflag.Value of every valued option: it records each
// occurrence so the values are checked after parsing, in order, by
// config.Set (whose errors carry the exact rule) rather than by pflag.
type recorder struct {
	name string
	all  *[]given
}

func (r *recorder) String() string { return "" }
func (r *recorder) Type() string   { return "string" }
func (r *recorder) Set(v string) error {
	*r.all = append(*r.all, given{r.name, v})
	return nil
}

// Parse parses the command line (args excludes argv[0]). Options end at the
// first non-option or at "--"; what follows is the program and its
// arguments, left untouched. Both --opt=value and --opt value are accepted.
// A repeated option takes its last value (every value is checked). Every
// error is a *UsageError of one line.
func Parse(args []string) (*Invocation, error) {
	fs := pflag.NewFlagSet("msmemscope", pflag.ContinueOnError)
	fs.SetInterspersed(false)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}

	var all []given
	for _, o := range valued {
		fs.Var(&recorder{name: o.name, all: &all}, o.name, o.help)
	}
	help := fs.BoolP("help", "h", false, "")
	version := fs.BoolP("version", "v", false, "")
	compare := fs.Bool("compare", false, "")
	timeline := fs.Bool("timeline", false, "")

	if err := fs.Parse(args); err != nil {
		return nil, pflagError(err)
	}

	inv := &Invocation{Config: config.Default(), IntervalMs: DefaultIntervalMs, Set: map[string]bool{}}
	fs.Visit(func(f *pflag.Flag) { inv.Set[f.Name] = true })
	switch {
	case *help:
		inv.Mode = ModeHelp
		return inv, nil
	case *version:
		inv.Mode = ModeVersion
		return inv, nil
	}

	cfg := config.Default()
	inputValue := ""
	for _, g := range all {
		switch g.name {
		case "input":
			in, err := parseInputs(g.value)
			if err != nil {
				return nil, wrap(err)
			}
			inv.Inputs, inputValue = in, g.value
		case "interval-ms":
			n, ok := parseUint(strings.TrimSpace(g.value), 1, MaxIntervalMs)
			if !ok {
				return nil, wrap(&config.OptionError{Option: "interval-ms", Value: g.value, Rule: "must be an integer in [1,3600000]"})
			}
			inv.IntervalMs = n
		default:
			if err := cfg.Set(g.name, g.value); err != nil {
				return nil, wrap(err)
			}
		}
	}

	prog := fs.Args()
	offline := ""
	switch {
	case *compare && *timeline:
		return nil, usage("--compare and --timeline cannot be used together")
	case *compare:
		offline = "--compare"
	case *timeline:
		offline = "--timeline"
	case inv.Set["input"]:
		offline = "--input"
	}
	if offline != "" && len(prog) > 0 {
		return nil, usage("%s takes no program, but %q was given (a program is run only without --compare, --timeline and --input)", offline, prog[0])
	}
	if inv.Set["interval-ms"] && !*timeline {
		return nil, usage("--interval-ms needs --timeline")
	}
	switch {
	case *compare:
		inv.Mode = ModeCompare
		if !inv.Set["input"] {
			return nil, usage("--compare needs --input=<base_dir>,<compare_dir>")
		}
		if len(inv.Inputs) != 2 {
			return nil, wrap(&config.OptionError{Option: "input", Value: inputValue, Rule: "--compare needs two paths: <base_dir>,<compare_dir>"})
		}
	case *timeline:
		inv.Mode = ModeTimeline
		if !inv.Set["input"] {
			return nil, usage("--timeline needs --input=<capture_or_log_dir>")
		}
		if len(inv.Inputs) != 1 {
			return nil, wrap(&config.OptionError{Option: "input", Value: inputValue, Rule: "--timeline takes one path"})
		}
	case inv.Set["input"]:
		inv.Mode = ModeOffline
		if len(inv.Inputs) != 1 {
			return nil, wrap(&config.OptionError{Option: "input", Value: inputValue, Rule: "must be one capture folder (two folders need --compare)"})
		}
	default:
		inv.Mode = ModeRun
		if len(prog) == 0 {
			return nil, usage("no program given: msmemscope [options] <prog> [prog args] (see msmemscope --help)")
		}
		if prog[0] == "" {
			return nil, usage("the program name is empty")
		}
		inv.Program = prog
	}

	if err := cfg.Finish(); err != nil {
		return nil, wrap(err)
	}
	out, err := config.AbsOutput(cfg.Output)
	if err != nil {
		return nil, wrap(err)
	}
	cfg.Output = out
	inv.Config = cfg
	return inv, nil
}

// parseInputs splits --input on ASCII or full-width commas and checks each
// path.
func parseInputs(v string) ([]string, error) {
	items := config.SplitList(v)
	if len(items) == 0 {
		return nil, &config.OptionError{Option: "input", Value: v, Rule: "must not be empty"}
	}
	for _, p := range items {
		if p == "" {
			return nil, &config.OptionError{Option: "input", Value: v, Rule: "empty item in the comma-separated list"}
		}
		if err := config.CheckPath("input", p); err != nil {
			return nil, err
		}
	}
	return items, nil
}

// pflagError turns pflag's errors into one-line UsageErrors.
func pflagError(err error) *UsageError {
	var ne *pflag.NotExistError
	var vr *pflag.ValueRequiredError
	var iv *pflag.InvalidValueError
	var is *pflag.InvalidSyntaxError
	switch {
	case errors.As(err, &ne):
		if ne.GetSpecifiedShortnames() != "" {
			return usage("unknown option -%s; see msmemscope --help", ne.GetSpecifiedName())
		}
		return usage("unknown option --%s; see msmemscope --help", ne.GetSpecifiedName())
	case errors.As(err, &vr):
		if vr.GetSpecifiedShortnames() != "" {
			return usage("option -%s needs a value", vr.GetSpecifiedName())
		}
		return usage("option --%s needs a value", vr.GetSpecifiedName())
	case errors.As(err, &iv):
		return wrap(&config.OptionError{Option: iv.GetFlag().Name, Value: iv.GetValue(), Rule: "takes no value (or true or false)"})
	case errors.As(err, &is):
		return usage("bad option syntax %q", is.GetSpecifiedFlag())
	}
	return usage("%s", strings.ReplaceAll(err.Error(), "\n", " "))
}

func parseUint(s string, lo, hi int) (int, bool) {
	if s == "" || len(s) > 10 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < int64(lo) || n > int64(hi) {
		return 0, false
	}
	return int(n), true
}

// Help returns the help text: the usage forms and every option with its
// default.
func Help() string {
	var b strings.Builder
	b.WriteString(`msmemscope: memory profiler for Linux processes, PyTorch and CUDA devices

Usage:
  msmemscope [options] <prog> [prog args]        options end at the first non-option
  msmemscope [options] -- <prog> [prog options]
  msmemscope [options] bash user.sh
  msmemscope --compare --input=<base_dir>,<compare_dir> [--output=DIR]
  msmemscope --input=<capture_dir> [--analysis=...] [--data-format=...]
  msmemscope --timeline --input=<capture_or_log_dir> [--interval-ms=100]

Options (--opt=value or --opt value; LIST is comma-separated, ASCII or full-width comma):
  -h, --help              print this help
  -v, --version           print the version
`)
	def := config.Default()
	for _, o := range valued {
		if o.name == "input" {
			b.WriteString("  --compare               compare two captures (needs --input=A,B)\n")
		}
		if o.name == "interval-ms" {
			b.WriteString("  --timeline              print the peak timeline of a capture (needs --input=DIR)\n")
		}
		fmt.Fprintf(&b, "  --%s=%s\n      %s", o.name, o.arg, o.help)
		d := o.def(def)
		if d == "" {
			d = "none"
		}
		fmt.Fprintf(&b, " (default: %s)\n", d)
	}
	b.WriteString(`
A violation of an option's rules prints one line naming the option, the value and the rule, and exits 2.
`)
	return b.String()
}

// staticMsg is the refusal of a statically linked program.
const staticMsg = "%s is statically linked: msmemscope needs a dynamically linked program (it interposes the allocator through LD_PRELOAD)"

// CheckProgram resolves a program name as exec.LookPath does (through PATH
// when it has no slash) and refuses what could not be traced: a missing or
// non-executable file, and a statically linked ELF program (no PT_INTERP).
// A script ("#!") is allowed when its interpreter is dynamically linked (the
// interpreter is checked, through at most 4 levels); other non-ELF files are
// allowed. resolved is absolute. Errors are one-line *UsageErrors.
func CheckProgram(path string) (resolved string, err error) {
	if path == "" {
		return "", usage("the program name is empty")
	}
	r, err := exec.LookPath(path)
	if err != nil && errors.Is(err, exec.ErrDot) {
		err = nil // found through "." in PATH: the user asked for it
	}
	if err != nil {
		if !strings.Contains(path, "/") {
			return "", usage("program %q not found in PATH", path)
		}
		return "", notRunnable(path)
	}
	if abs, e := filepath.Abs(r); e == nil {
		r = abs
	}
	if err := checkBinary(r, "", 0); err != nil {
		return "", err
	}
	return r, nil
}

func notRunnable(path string) *UsageError {
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return usage("program %q does not exist", path)
	case err != nil:
		return usage("program %q cannot be run: %s", path, oneLine(err))
	case st.IsDir():
		return usage("program %q is a directory", path)
	}
	return usage("program %q is not executable", path)
}

func oneLine(err error) string {
	return strings.NewReplacer("\n", " ", "\r", " ").Replace(err.Error())
}

// checkBinary checks the file that execve would load for path; script is the
// script whose interpreter path is ("" for the program itself).
func checkBinary(path, script string, level int) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return nil // executable but unreadable: cannot tell, let it run
		}
		if script != "" {
			return usage("%s: its interpreter %s cannot be run: %s", script, path, oneLine(err))
		}
		return usage("program %q cannot be run: %s", path, oneLine(err))
	}
	defer f.Close()
	head := make([]byte, 256) // BINPRM_BUF_SIZE: what the kernel reads of "#!"
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, []byte(elf.ELFMAG)):
		ef, err := elf.NewFile(f)
		if err != nil {
			return usage("%s is not a valid ELF file: %s", path, oneLine(err))
		}
		defer ef.Close()
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				return nil
			}
		}
		if script != "" {
			return usage(staticMsg, path+" (the interpreter of "+script+")")
		}
		return usage(staticMsg, path)
	case bytes.HasPrefix(head, []byte("#!")):
		if level >= 4 {
			return nil // the kernel refuses deeper nesting itself
		}
		line, _, _ := bufio.NewReader(bytes.NewReader(head[2:])).ReadLine()
		fields := strings.Fields(string(line))
		if len(fields) == 0 {
			return usage("%s: empty #! line", path)
		}
		interp := fields[0]
		if st, err := os.Stat(interp); err != nil || st.IsDir() {
			return usage("%s: its interpreter %s does not exist", path, interp)
		}
		return checkBinary(interp, path, level+1)
	}
	return nil // not ELF, not "#!": run by the shell fallback of execvp
}
