package cli

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"msmemscope/config"
)

func TestParseErrors(t *testing.T) {
	long := "/" + strings.Repeat("p", 4096)
	tests := []struct {
		args []string
		want string
	}{
		// option rules, via config.Set
		{[]string{"--device=gpu", "prog"}, `invalid value "gpu" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{[]string{"--device", "", "prog"}, `invalid value "" for --device: must not be empty: give cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{[]string{"--level=3", "prog"}, `invalid value "3" for --level: must be op (or 0) or kernel (or 1)`},
		{[]string{"--events=alloc,oom", "prog"}, `invalid value "oom" for --events: must be one of alloc, free, launch, access, traceback`},
		{[]string{"--call-stack=python:1001", "prog"}, `invalid value "python:1001" for --call-stack: depth must be an integer in [0,1000]`},
		{[]string{"--collect-mode=later", "prog"}, `invalid value "later" for --collect-mode: must be immediate or deferred`},
		{[]string{"--output", "--data-format=db", "prog"}, `invalid value "--data-format=db" for --output: must not begin with '-' (another option taken as its value? a folder so named: ./-name)`},
		{[]string{"--analysis=leaks,oom", "prog"}, `invalid value "oom" for --analysis: must be one of leaks, inefficient, decompose`},
		{[]string{"--steps=1,2,3,4,5,6", "prog"}, `invalid value "1,2,3,4,5,6" for --steps: at most 5 step ids`},
		{[]string{"--watch=aten::add:out0", "prog"}, `invalid value "aten::add:out0" for --watch: out{id} requires start: [start[:out{id}],]end[,full-content]`},
		{[]string{"--data-format=xml", "prog"}, `invalid value "xml" for --data-format: must be csv or db`},
		{[]string{"--output=", "prog"}, `invalid value "" for --output: must not be empty`},
		{[]string{"--output=" + long, "prog"}, `invalid value "` + long[:64] + `..." for --output: must be at most 4096 bytes`},
		{[]string{"--log-level=trace", "prog"}, `invalid value "trace" for --log-level: must be info, warn or error`},
		{[]string{"--log-mode=x", "prog"}, `invalid value "x" for --log-mode: must be full or rotate`},
		{[]string{"--log-files=0", "prog"}, `invalid value "0" for --log-files: must be an integer in [1,1000]`},
		{[]string{"--log-file-mb=x", "prog"}, `invalid value "x" for --log-file-mb: must be an integer in [1,10240]`},
		// the first bad value is reported, even when a later one replaces it
		{[]string{"--level=9", "--level=op", "prog"}, `invalid value "9" for --level: must be op (or 0) or kernel (or 1)`},
		// unknown options and pflag errors
		{[]string{"--bogus", "prog"}, `unknown option --bogus; see msmemscope --help`},
		{[]string{"--bogus=1", "prog"}, `unknown option --bogus; see msmemscope --help`},
		{[]string{"-x", "prog"}, `unknown option -x; see msmemscope --help`},
		{[]string{"-hx", "prog"}, `unknown option -x; see msmemscope --help`},
		{[]string{"--call_stack=c", "prog"}, `unknown option --call_stack; see msmemscope --help`},
		{[]string{"--device"}, `option --device needs a value`},
		{[]string{"--compare=maybe", "--input=a,b"}, `invalid value "maybe" for --compare: takes no value (or true or false)`},
		{[]string{"---x", "prog"}, `bad option syntax "---x"`},
		// program and modes
		{nil, `no program given: msmemscope [options] <prog> [prog args] (see msmemscope --help)`},
		{[]string{"--events=alloc"}, `no program given: msmemscope [options] <prog> [prog args] (see msmemscope --help)`},
		{[]string{"--events=alloc", "--"}, `no program given: msmemscope [options] <prog> [prog args] (see msmemscope --help)`},
		{[]string{"", "x"}, `the program name is empty`},
		{[]string{"--compare"}, `--compare needs --input=<base_dir>,<compare_dir>`},
		{[]string{"--compare", "--input=a"}, `invalid value "a" for --input: --compare needs two paths: <base_dir>,<compare_dir>`},
		{[]string{"--compare", "--input=a,b,c"}, `invalid value "a,b,c" for --input: --compare needs two paths: <base_dir>,<compare_dir>`},
		{[]string{"--compare", "--input=a,b", "python", "x.py"}, `--compare takes no program, but "python" was given (a program is run only without --compare, --timeline and --input)`},
		{[]string{"--compare", "--input=a,b", "--", "prog"}, `--compare takes no program, but "prog" was given (a program is run only without --compare, --timeline and --input)`},
		{[]string{"--timeline", "--input=a", "prog"}, `--timeline takes no program, but "prog" was given (a program is run only without --compare, --timeline and --input)`},
		{[]string{"--input=a", "prog"}, `--input takes no program, but "prog" was given (a program is run only without --compare, --timeline and --input)`},
		{[]string{"--timeline"}, `--timeline needs --input=<capture_or_log_dir>`},
		{[]string{"--timeline", "--input=a,b"}, `invalid value "a,b" for --input: --timeline takes one path`},
		{[]string{"--input=a,b"}, `invalid value "a,b" for --input: must be one capture folder (two folders need --compare)`},
		{[]string{"--compare", "--timeline", "--input=a,b"}, `--compare and --timeline cannot be used together`},
		{[]string{"--input="}, `invalid value "" for --input: must not be empty`},
		{[]string{"--compare", "--input=a,"}, `invalid value "a," for --input: empty item in the comma-separated list`},
		{[]string{"--compare", "--input=a," + long}, `invalid value "` + long[:64] + `..." for --input: must be at most 4096 bytes`},
		{[]string{"--input=a\nb"}, `invalid value "a\nb" for --input: must not contain NUL or newline characters`},
		{[]string{"--timeline", "--input=a", "--interval-ms=0"}, `invalid value "0" for --interval-ms: must be an integer in [1,3600000]`},
		{[]string{"--timeline", "--input=a", "--interval-ms=1.5"}, `invalid value "1.5" for --interval-ms: must be an integer in [1,3600000]`},
		{[]string{"--input=a", "--interval-ms=10"}, `--interval-ms needs --timeline`},
		{[]string{"--interval-ms=10", "prog"}, `--interval-ms needs --timeline`},
	}
	for _, tt := range tests {
		name := strings.Join(tt.args, " ")
		t.Run(name[:min(len(name), 60)], func(t *testing.T) {
			inv, err := Parse(tt.args)
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want error %s", tt.args, inv, tt.want)
			}
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("error %T is not a *UsageError", err)
			}
			if err.Error() != tt.want {
				t.Errorf("Parse(%q):\n got %s\nwant %s", tt.args, err, tt.want)
			}
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Errorf("error is not one line: %q", err)
			}
			if strings.HasPrefix(tt.want, "invalid value") {
				var oe *config.OptionError
				if !errors.As(err, &oe) {
					t.Errorf("%v does not unwrap to a *config.OptionError", err)
				}
			}
		})
	}
}

func TestParseSplitting(t *testing.T) {
	tests := []struct {
		args    []string
		program []string
		set     []string
	}{
		{[]string{"--events=alloc", "prog", "--events=x"}, []string{"prog", "--events=x"}, []string{"events"}},
		{[]string{"--events", "alloc", "prog", "-v"}, []string{"prog", "-v"}, []string{"events"}},
		{[]string{"--", "prog", "-x"}, []string{"prog", "-x"}, nil},
		{[]string{"--device=cpu", "--", "--prog", "-h"}, []string{"--prog", "-h"}, []string{"device"}},
		{[]string{"bash", "user.sh"}, []string{"bash", "user.sh"}, nil},
		{[]string{"--analysis=leaks", "bash", "user.sh", "--", "--help"}, []string{"bash", "user.sh", "--", "--help"}, []string{"analysis"}},
		{[]string{"-", "x"}, []string{"-", "x"}, nil},
		{[]string{"--output", "./-o", "prog"}, []string{"prog"}, []string{"output"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			inv, err := Parse(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if inv.Mode != ModeRun {
				t.Errorf("mode %v", inv.Mode)
			}
			if !reflect.DeepEqual(inv.Program, tt.program) {
				t.Errorf("program %q, want %q", inv.Program, tt.program)
			}
			want := map[string]bool{}
			for _, s := range tt.set {
				want[s] = true
			}
			if !reflect.DeepEqual(inv.Set, want) {
				t.Errorf("set %v, want %v", inv.Set, want)
			}
		})
	}
}

func TestParseConfig(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	inv, err := Parse([]string{
		"--device", "npu:3，cpu", "--level=1", "--events=launch", "--call-stack=c:20,python",
		"--collect-mode", "deferred", "--analysis=inefficient", "--steps=2,1", "--watch=a:out1,b,full-content",
		"--data-format=db", "--output=out", "--log-level=info", "--log-mode=rotate", "--log-files=4",
		"--log-file-mb=8", "--analysis=decompose", "python3", "train.py", "--lr=1"})
	if err != nil {
		t.Fatal(err)
	}
	want := config.Config{
		Devices:     []string{"cpu", "cuda:3"},
		Level:       "kernel",
		Events:      config.Events{Alloc: true, Free: true, Launch: true},
		PyStack:     50,
		CStack:      20,
		PyStackOn:   true,
		CStackOn:    true,
		CollectMode: "deferred",
		Analysis:    []string{"decompose"}, // the last --analysis wins
		Steps:       []int{1, 2},
		Watch:       &config.Watch{Start: "a", StartOut: 1, End: "b", FullContent: true},
		DataFormat:  "db",
		Output:      filepath.Join(wd, "out"),
		LogLevel:    "info",
		LogMode:     "rotate",
		LogFiles:    4,
		LogFileMB:   8,
	}
	if !reflect.DeepEqual(inv.Config, want) {
		t.Errorf("config\n got %s\nwant %s", inv.Config.Encode(), want.Encode())
	}
	if !reflect.DeepEqual(inv.Program, []string{"python3", "train.py", "--lr=1"}) {
		t.Errorf("program %q", inv.Program)
	}
	if inv.IntervalMs != DefaultIntervalMs || inv.Inputs != nil {
		t.Errorf("interval %d inputs %q", inv.IntervalMs, inv.Inputs)
	}

	// Defaults: Finish applied (a no-op) and the output made absolute.
	inv, err = Parse([]string{"prog"})
	if err != nil {
		t.Fatal(err)
	}
	def := config.Default()
	def.Output = filepath.Join(wd, "memscopeDumpResults")
	if !reflect.DeepEqual(inv.Config, def) {
		t.Errorf("default config %s", inv.Config.Encode())
	}
	if len(inv.Set) != 0 {
		t.Errorf("set %v", inv.Set)
	}

	// Implications hold whatever the order.
	for _, args := range [][]string{
		{"--analysis=inefficient", "--events=", "prog"},
		{"--events=", "--analysis=inefficient", "prog"},
	} {
		inv, err := Parse(args)
		if err != nil {
			t.Fatal(err)
		}
		if e := inv.Config.Events; e != (config.Events{Alloc: true, Free: true, Launch: true, Access: true}) {
			t.Errorf("%q: events %+v", args, e)
		}
	}
}

func TestParseModes(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args     []string
		mode     Mode
		inputs   []string
		interval int
	}{
		{[]string{"-h"}, ModeHelp, nil, 100},
		{[]string{"--help", "prog"}, ModeHelp, nil, 100},
		{[]string{"--device=gpu", "--help"}, ModeHelp, nil, 100}, // help wins over a bad value
		{[]string{"-v"}, ModeVersion, nil, 100},
		{[]string{"--version"}, ModeVersion, nil, 100},
		{[]string{"-hv"}, ModeHelp, nil, 100},
		{[]string{"--compare", "--input=base,cmp", "--output=o"}, ModeCompare, []string{"base", "cmp"}, 100},
		{[]string{"--input", "/a/b，c", "--compare"}, ModeCompare, []string{"/a/b", "c"}, 100},
		{[]string{"--input=cap", "--analysis=leaks,decompose", "--data-format=db"}, ModeOffline, []string{"cap"}, 100},
		{[]string{"--timeline", "--input=cap"}, ModeTimeline, []string{"cap"}, 100},
		{[]string{"--timeline", "--input=cap", "--interval-ms", "250"}, ModeTimeline, []string{"cap"}, 250},
		{[]string{"--input=x", "--input=cap", "--timeline"}, ModeTimeline, []string{"cap"}, 100},
		{[]string{"--timeline", "--input=cap", "--"}, ModeTimeline, []string{"cap"}, 100},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			inv, err := Parse(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if inv.Mode != tt.mode {
				t.Errorf("mode %v, want %v", inv.Mode, tt.mode)
			}
			if !reflect.DeepEqual(inv.Inputs, tt.inputs) {
				t.Errorf("inputs %q, want %q", inv.Inputs, tt.inputs)
			}
			if inv.IntervalMs != tt.interval {
				t.Errorf("interval %d", inv.IntervalMs)
			}
			if inv.Program != nil {
				t.Errorf("program %q", inv.Program)
			}
			if tt.mode != ModeHelp && tt.mode != ModeVersion && !filepath.IsAbs(inv.Config.Output) {
				t.Errorf("output %q not absolute", inv.Config.Output)
			}
		})
	}
	inv, err := Parse([]string{"--compare", "--input=a,b", "--output=o"})
	if err != nil {
		t.Fatal(err)
	}
	if inv.Config.Output != filepath.Join(wd, "o") || !inv.Set["compare"] || !inv.Set["input"] || !inv.Set["output"] {
		t.Errorf("%+v", inv)
	}
}

func TestHelp(t *testing.T) {
	h := Help()
	for _, s := range []string{
		"-h, --help", "-v, --version", "--compare", "--timeline",
		"msmemscope [options] <prog> [prog args]", "msmemscope [options] -- <prog> [prog options]",
		"msmemscope [options] bash user.sh", "--compare --input=<base_dir>,<compare_dir>",
		"--timeline --input=<capture_or_log_dir>",
		"(default: cpu,cuda)", "(default: op)", "(default: alloc,free,launch)", "(default: immediate)",
		"(default: leaks)", "(default: csv)", "(default: ./memscopeDumpResults)", "(default: warn)",
		"(default: full)", "(default: 10)", "(default: 100)",
	} {
		if !strings.Contains(h, s) {
			t.Errorf("help lacks %q", s)
		}
	}
	for _, o := range append(append([]string{}, config.Options...), "input", "interval-ms") {
		if !strings.Contains(h, "--"+o+"=") {
			t.Errorf("help lacks --%s", o)
		}
	}
}

func TestCheckProgram(t *testing.T) {
	dir := t.TempDir()

	// A dynamically linked program, by name through PATH and by path.
	truePath, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no true in PATH")
	}
	if got, err := CheckProgram("true"); err != nil || got != truePath {
		t.Errorf("CheckProgram(true) = %q, %v", got, err)
	}
	if _, err := CheckProgram("/bin/true"); err != nil {
		t.Errorf("CheckProgram(/bin/true): %v", err)
	}

	// A shell script: its interpreter (dynamic) is what runs.
	script := filepath.Join(dir, "user.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := CheckProgram(script); err != nil || got != script {
		t.Errorf("CheckProgram(script) = %q, %v", got, err)
	}
	// A script without #! (run by the shell fallback) is allowed too.
	plain := filepath.Join(dir, "plain.sh")
	if err := os.WriteFile(plain, []byte("echo hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckProgram(plain); err != nil {
		t.Errorf("CheckProgram(plain): %v", err)
	}
	// Relative paths come back absolute.
	t.Chdir(dir)
	if got, err := CheckProgram("./user.sh"); err != nil || got != script {
		t.Errorf("CheckProgram(./user.sh) = %q, %v", got, err)
	}

	// Missing, not executable, directory, bad interpreter.
	noexec := filepath.Join(dir, "noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badInterp := filepath.Join(dir, "bad.sh")
	if err := os.WriteFile(badInterp, []byte("#!/nonexistent/interp -x\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	errs := []struct{ path, want string }{
		{"", `the program name is empty`},
		{"no-such-program-msmemscope", `program "no-such-program-msmemscope" not found in PATH`},
		{"./missing", `program "./missing" does not exist`},
		{noexec, `program "` + noexec + `" is not executable`},
		{dir + "/", `program "` + dir + `/" is a directory`},
		{badInterp, badInterp + `: its interpreter /nonexistent/interp does not exist`},
	}
	for _, e := range errs {
		_, err := CheckProgram(e.path)
		if err == nil {
			t.Errorf("CheckProgram(%q) = nil", e.path)
			continue
		}
		if e.want != "" && err.Error() != e.want {
			t.Errorf("CheckProgram(%q):\n got %s\nwant %s", e.path, err, e.want)
		}
		var ue *UsageError
		if !errors.As(err, &ue) {
			t.Errorf("CheckProgram(%q): %T is not a *UsageError", e.path, err)
		}
	}

	// A statically linked program is refused, and so is a script run by one.
	src := filepath.Join(dir, "s.c")
	if err := os.WriteFile(src, []byte("int main(void){return 0;}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	static := filepath.Join(dir, "static")
	if out, err := exec.Command("gcc", "-static", "-o", static, src).CombinedOutput(); err != nil {
		t.Skipf("gcc -static cannot link here: %v: %s", err, out)
	}
	want := static + " is statically linked: msmemscope needs a dynamically linked program (it interposes the allocator through LD_PRELOAD)"
	if _, err := CheckProgram(static); err == nil || err.Error() != want {
		t.Errorf("CheckProgram(static):\n got %v\nwant %s", err, want)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	if _, err := CheckProgram("static"); err == nil || err.Error() != want {
		t.Errorf("CheckProgram(static through PATH):\n got %v\nwant %s", err, want)
	}
	viaStatic := filepath.Join(dir, "via-static")
	if err := os.WriteFile(viaStatic, []byte("#!"+static+" arg\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	want = static + " (the interpreter of " + viaStatic + ") is statically linked: msmemscope needs a dynamically linked program (it interposes the allocator through LD_PRELOAD)"
	if _, err := CheckProgram(viaStatic); err == nil || err.Error() != want {
		t.Errorf("CheckProgram(script on static interpreter):\n got %v\nwant %s", err, want)
	}
}
