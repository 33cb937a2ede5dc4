package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// apply sets each name=value pair in order on Default() and calls Finish.
func apply(t *testing.T, kv ...string) (Config, error) {
	t.Helper()
	c := Default()
	for i := 0; i+1 < len(kv); i += 2 {
		if err := c.Set(kv[i], kv[i+1]); err != nil {
			return c, err
		}
	}
	return c, c.Finish()
}

func TestSetErrors(t *testing.T) {
	long := strings.Repeat("a", 4097)
	tests := []struct {
		name, value, want string
	}{
		// device
		{"device", "gpu", `invalid value "gpu" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "cpu,gpu", `invalid value "gpu" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "cuda:32", `invalid value "cuda:32" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "npu:-1", `invalid value "npu:-1" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "cuda:", `invalid value "cuda:" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "cuda:x", `invalid value "cuda:x" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "cpu:0", `invalid value "cpu:0" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "CPU", `invalid value "CPU" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "", `invalid value "" for --device: must not be empty: give cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "  ", `invalid value "  " for --device: must not be empty: give cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"device", "cpu,", `invalid value "cpu," for --device: empty item in the comma-separated list`},
		{"device", "cpu,,cuda", `invalid value "cpu,,cuda" for --device: empty item in the comma-separated list`},
		// level
		{"level", "2", `invalid value "2" for --level: must be op (or 0) or kernel (or 1)`},
		{"level", "", `invalid value "" for --level: must be op (or 0) or kernel (or 1)`},
		{"level", "OP", `invalid value "OP" for --level: must be op (or 0) or kernel (or 1)`},
		// events
		{"events", "alloc,malloc", `invalid value "malloc" for --events: must be one of alloc, free, launch, access, traceback`},
		{"events", "alloc,", `invalid value "alloc," for --events: empty item in the comma-separated list`},
		// call-stack
		{"call-stack", "java", `invalid value "java" for --call-stack: must be python[:depth] or c[:depth], comma-separated`},
		{"call_stack", "java:3", `invalid value "java:3" for --call-stack: must be python[:depth] or c[:depth], comma-separated`},
		{"call-stack", "python:1001", `invalid value "python:1001" for --call-stack: depth must be an integer in [0,1000]`},
		{"call-stack", "c:-1", `invalid value "c:-1" for --call-stack: depth must be an integer in [0,1000]`},
		{"call-stack", "c:", `invalid value "c:" for --call-stack: depth must be an integer in [0,1000]`},
		{"call-stack", "python:x", `invalid value "python:x" for --call-stack: depth must be an integer in [0,1000]`},
		{"call-stack", "c:1,c:2", `invalid value "c:1,c:2" for --call-stack: c given twice`},
		{"call-stack", "python,c,python:3", `invalid value "python,c,python:3" for --call-stack: python given twice`},
		// collect-mode
		{"collect-mode", "lazy", `invalid value "lazy" for --collect-mode: must be immediate or deferred`},
		{"collect_mode", "", `invalid value "" for --collect-mode: must be immediate or deferred`},
		// analysis
		{"analysis", "leaks,leak", `invalid value "leak" for --analysis: must be one of leaks, inefficient, decompose`},
		// steps
		{"steps", "0", `invalid value "0" for --steps: step ids must be integers in [1,2147483647]`},
		{"steps", "1,-2", `invalid value "-2" for --steps: step ids must be integers in [1,2147483647]`},
		{"steps", "1,x", `invalid value "x" for --steps: step ids must be integers in [1,2147483647]`},
		{"steps", "2147483648", `invalid value "2147483648" for --steps: step ids must be integers in [1,2147483647]`},
		{"steps", "1,2,3,4,5,6", `invalid value "1,2,3,4,5,6" for --steps: at most 5 step ids`},
		{"steps", "1,2,1", `invalid value "1,2,1" for --steps: step id 1 given twice`},
		{"steps", "1,", `invalid value "1," for --steps: empty item in the comma-separated list`},
		// watch
		{"watch", "full-content", `invalid value "full-content" for --watch: end is required: [start[:out{id}],]end[,full-content]`},
		{"watch", "aten::add:out0", `invalid value "aten::add:out0" for --watch: out{id} requires start: [start[:out{id}],]end[,full-content]`},
		{"watch", "aten::add:out0,full-content", `invalid value "aten::add:out0,full-content" for --watch: out{id} requires start: [start[:out{id}],]end[,full-content]`},
		{"watch", "a,b:out1", `invalid value "a,b:out1" for --watch: out{id} applies to start only: [start[:out{id}],]end[,full-content]`},
		{"watch", "a,b,c", `invalid value "a,b,c" for --watch: must be [start[:out{id}],]end[,full-content]`},
		{"watch", "full-content,b", `invalid value "full-content,b" for --watch: full-content must come last: [start[:out{id}],]end[,full-content]`},
		{"watch", "a,,b", `invalid value "a,,b" for --watch: empty item in the comma-separated list`},
		{"watch", "aten::add#0,aten::mul", `invalid value "aten::add#0" for --watch: N in #N must be an integer in [1,2147483647]`},
		{"watch", "aten::mul#", `invalid value "aten::mul#" for --watch: N in #N must be an integer in [1,2147483647]`},
		{"watch", "aten::mul#x", `invalid value "aten::mul#x" for --watch: N in #N must be an integer in [1,2147483647]`},
		{"watch", "#2", `invalid value "#2" for --watch: operator name must not be empty`},
		{"watch", "a:out99999,b", `invalid value "a:out99999" for --watch: id in out{id} must be an integer in [0,65535]`},
		{"watch", "a:out0#2,b", `invalid value "a:out0#2" for --watch: #N goes before out{id}: start[#N][:out{id}]`},
		// data-format, log-*
		{"data-format", "json", `invalid value "json" for --data-format: must be csv or db`},
		{"data_format", "", `invalid value "" for --data-format: must be csv or db`},
		{"log-level", "debug", `invalid value "debug" for --log-level: must be info, warn or error`},
		{"log-mode", "ring", `invalid value "ring" for --log-mode: must be full or rotate`},
		{"log-files", "0", `invalid value "0" for --log-files: must be an integer in [1,1000]`},
		{"log-files", "1001", `invalid value "1001" for --log-files: must be an integer in [1,1000]`},
		{"log_files", "+3", `invalid value "+3" for --log-files: must be an integer in [1,1000]`},
		{"log-file-mb", "0", `invalid value "0" for --log-file-mb: must be an integer in [1,10240]`},
		{"log-file-mb", "10241", `invalid value "10241" for --log-file-mb: must be an integer in [1,10240]`},
		{"log-file-mb", "1.5", `invalid value "1.5" for --log-file-mb: must be an integer in [1,10240]`},
		// output
		{"output", "", `invalid value "" for --output: must not be empty`},
		{"output", long, `invalid value "` + strings.Repeat("a", 64) + `..." for --output: must be at most 4096 bytes`},
		{"output", "a\nb", `invalid value "a\nb" for --output: must not contain NUL or newline characters`},
		{"output", "a\x00b", `invalid value "a\x00b" for --output: must not contain NUL or newline characters`},
		{"output", "--steps=1", `invalid value "--steps=1" for --output: must not begin with '-' (another option taken as its value? a folder so named: ./-name)`},
		{"output", "  ", `invalid value "  " for --output: must not be blank`},
		// unknown
		{"devices", "cpu", `unknown option "devices"`},
		{"compare", "", `unknown option "compare"`},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value[:min(len(tt.value), 40)], func(t *testing.T) {
			c := Default()
			before := c.Encode()
			err := c.Set(tt.name, tt.value)
			if err == nil {
				t.Fatalf("Set(%q, %q) = nil, want %s", tt.name, tt.value, tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("Set(%q, %q):\n got %s\nwant %s", tt.name, tt.value, err, tt.want)
			}
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Errorf("error is not one line: %q", err)
			}
			if c.Encode() != before {
				t.Errorf("a failed Set changed the config: %s", c.Encode())
			}
			var oe *OptionError
			var ue *UnknownOptionError
			if !errors.As(err, &oe) && !errors.As(err, &ue) {
				t.Errorf("error type %T", err)
			}
		})
	}
}

func TestSetValid(t *testing.T) {
	def := Default()
	tests := []struct {
		name string
		kv   []string
		edit func(c *Config) // applied to Default() gives the expected config
	}{
		{"defaults", nil, func(c *Config) {}},
		// device
		{"device cpu", []string{"device", "cpu"}, func(c *Config) { c.Devices = []string{"cpu"} }},
		{"device npu alias", []string{"device", "npu"}, func(c *Config) { c.Devices = []string{"cuda"} }},
		{"device npu id alias", []string{"device", "npu:7,npu:2"}, func(c *Config) { c.Devices = []string{"cuda:2", "cuda:7"} }},
		{"device cuda absorbs ids", []string{"device", "cuda:3,cuda,cpu"}, func(c *Config) { c.Devices = []string{"cpu", "cuda"} }},
		{"device full-width comma", []string{"device", "cuda:1，cpu"}, func(c *Config) { c.Devices = []string{"cpu", "cuda:1"} }},
		{"device dedupe and blanks", []string{"device", " cuda:31 , npu:31,cpu,cpu"}, func(c *Config) { c.Devices = []string{"cpu", "cuda:31"} }},
		{"device id 0 and leading zero", []string{"device", "cuda:0,cuda:05"}, func(c *Config) { c.Devices = []string{"cuda:0", "cuda:5"} }},
		// level
		{"level 0", []string{"level", "0"}, func(c *Config) { c.Level = "op" }},
		{"level 1", []string{"level", "1"}, func(c *Config) { c.Level = "kernel" }},
		{"level kernel", []string{"level", "kernel"}, func(c *Config) { c.Level = "kernel" }},
		// events (analysis off so no implications from it)
		{"events alloc implies free", []string{"analysis", "", "events", "alloc"}, func(c *Config) {
			c.Analysis = []string{}
			c.Events = Events{Alloc: true, Free: true}
		}},
		{"events free implies alloc", []string{"analysis", "", "events", "free,launch"}, func(c *Config) {
			c.Analysis = []string{}
			c.Events = Events{Alloc: true, Free: true, Launch: true}
		}},
		{"events access implies both", []string{"analysis", "", "events", "access"}, func(c *Config) {
			c.Analysis = []string{}
			c.Events = Events{Alloc: true, Free: true, Access: true}
		}},
		{"events traceback only", []string{"analysis", "", "events", "traceback"}, func(c *Config) {
			c.Analysis = []string{}
			c.Events = Events{Traceback: true}
		}},
		{"events empty", []string{"events", "", "analysis", ""}, func(c *Config) {
			c.Analysis = []string{}
			c.Events = Events{}
		}},
		{"events full-width comma", []string{"events", "launch，traceback", "analysis", ""}, func(c *Config) {
			c.Analysis = []string{}
			c.Events = Events{Launch: true, Traceback: true}
		}},
		// analysis implications, in either order
		{"leaks implies alloc,free (events after)", []string{"analysis", "leaks", "events", "launch"}, func(c *Config) {
			c.Events = Events{Alloc: true, Free: true, Launch: true}
		}},
		{"leaks implies alloc,free (events before)", []string{"events", "launch", "analysis", "leaks"}, func(c *Config) {
			c.Events = Events{Alloc: true, Free: true, Launch: true}
		}},
		{"default leaks with empty events", []string{"events", ""}, func(c *Config) {
			c.Events = Events{Alloc: true, Free: true}
		}},
		{"decompose implies alloc,free", []string{"events", "traceback", "analysis", "decompose"}, func(c *Config) {
			c.Analysis = []string{"decompose"}
			c.Events = Events{Alloc: true, Free: true, Traceback: true}
		}},
		{"inefficient implies alloc,free,access,launch (events after)", []string{"analysis", "inefficient", "events", ""}, func(c *Config) {
			c.Analysis = []string{"inefficient"}
			c.Events = Events{Alloc: true, Free: true, Access: true, Launch: true}
		}},
		{"inefficient implies alloc,free,access,launch (events before)", []string{"events", "traceback", "analysis", "inefficient"}, func(c *Config) {
			c.Analysis = []string{"inefficient"}
			c.Events = Events{Alloc: true, Free: true, Access: true, Launch: true, Traceback: true}
		}},
		{"analysis normal order and dedupe", []string{"analysis", "decompose，leaks,decompose"}, func(c *Config) {
			c.Analysis = []string{"leaks", "decompose"}
		}},
		{"analysis empty", []string{"analysis", "", "events", "launch"}, func(c *Config) {
			c.Analysis = []string{}
			c.Events = Events{Launch: true}
		}},
		// call-stack
		{"call-stack python default depth", []string{"call-stack", "python"}, func(c *Config) {
			c.PyStackOn, c.PyStack = true, 50
		}},
		{"call_stack both with depths", []string{"call_stack", "c:10,python:5"}, func(c *Config) {
			c.PyStackOn, c.PyStack = true, 5
			c.CStackOn, c.CStack = true, 10
		}},
		{"call-stack depth 0 and 1000", []string{"call-stack", "c:0，python:1000"}, func(c *Config) {
			c.PyStackOn, c.PyStack = true, 1000
			c.CStackOn, c.CStack = true, 0
		}},
		{"call-stack replaced then empty", []string{"call-stack", "c:3", "call-stack", ""}, func(c *Config) {}},
		{"call-stack replaced", []string{"call-stack", "c:3", "call-stack", "python:2"}, func(c *Config) {
			c.PyStackOn, c.PyStack = true, 2
		}},
		// collect-mode, formats, logs
		{"collect-mode deferred", []string{"collect-mode", "deferred"}, func(c *Config) { c.CollectMode = "deferred" }},
		{"data-format db", []string{"data_format", "db"}, func(c *Config) { c.DataFormat = "db" }},
		{"log-level info", []string{"log-level", "info"}, func(c *Config) { c.LogLevel = "info" }},
		{"log rotate", []string{"log-mode", "rotate", "log-files", "3", "log-file-mb", "10240"}, func(c *Config) {
			c.LogMode, c.LogFiles, c.LogFileMB = "rotate", 3, 10240
		}},
		{"log-files bounds", []string{"log-files", "1000", "log_file_mb", "1"}, func(c *Config) {
			c.LogFiles, c.LogFileMB = 1000, 1
		}},
		// steps
		{"steps sorted", []string{"steps", "3，1,2"}, func(c *Config) { c.Steps = []int{1, 2, 3} }},
		{"steps five", []string{"steps", "5,4,3,2,1"}, func(c *Config) { c.Steps = []int{1, 2, 3, 4, 5} }},
		{"steps empty = all", []string{"steps", "1", "steps", ""}, func(c *Config) {}},
		// watch
		{"watch end only", []string{"watch", "aten::mul"}, func(c *Config) {
			c.Watch = &Watch{StartOut: -1, End: "aten::mul"}
		}},
		{"watch start out end full", []string{"watch", "aten::add_:out0,aten::mul,full-content"}, func(c *Config) {
			c.Watch = &Watch{Start: "aten::add_", StartOut: 0, End: "aten::mul", FullContent: true}
		}},
		{"watch nth launches", []string{"watch", "aten::add#2:out3，aten::mul#10"}, func(c *Config) {
			c.Watch = &Watch{Start: "aten::add#2", StartOut: 3, End: "aten::mul#10"}
		}},
		{"watch outer is a name", []string{"watch", "aten::outer,aten::sum"}, func(c *Config) {
			c.Watch = &Watch{Start: "aten::outer", StartOut: -1, End: "aten::sum"}
		}},
		{"watch end full-content", []string{"watch", "op1,full-content"}, func(c *Config) {
			c.Watch = &Watch{StartOut: -1, End: "op1", FullContent: true}
		}},
		{"watch off", []string{"watch", "a,b", "watch", ""}, func(c *Config) {}},
		// output
		{"output as given", []string{"output", "./out dir"}, func(c *Config) { c.Output = "./out dir" }},
		{"output 4096 bytes", []string{"output", strings.Repeat("o", 4096)}, func(c *Config) { c.Output = strings.Repeat("o", 4096) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := apply(t, tt.kv...)
			if err != nil {
				t.Fatalf("%v: %v", tt.kv, err)
			}
			want := def
			want.Devices = append([]string(nil), def.Devices...)
			want.Analysis = append([]string(nil), def.Analysis...)
			tt.edit(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%v:\n got %s\nwant %s", tt.kv, got.Encode(), want.Encode())
			}
			// Finish is idempotent.
			again := got
			if err := again.Finish(); err != nil || !reflect.DeepEqual(again, got) {
				t.Errorf("second Finish: %v, %s", err, again.Encode())
			}
		})
	}
}

func TestDefaultFinishes(t *testing.T) {
	c := Default()
	if err := c.Finish(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, Default()) {
		t.Errorf("Finish changed the defaults: %s", c.Encode())
	}
}

func TestFinishChecksWholeConfig(t *testing.T) {
	tests := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"no devices", func(c *Config) { c.Devices = nil },
			`invalid value "" for --device: must not be empty: give cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"bad device", func(c *Config) { c.Devices = []string{"tpu"} },
			`invalid value "tpu" for --device: must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]`},
		{"bad level", func(c *Config) { c.Level = "" }, `invalid value "" for --level: must be op (or 0) or kernel (or 1)`},
		{"bad analysis", func(c *Config) { c.Analysis = []string{"x"} }, `invalid value "x" for --analysis: must be one of leaks, inefficient, decompose`},
		{"too many steps", func(c *Config) { c.Steps = []int{1, 2, 3, 4, 5, 6} }, `invalid value "1,2,3,4,5,6" for --steps: at most 5 step ids`},
		{"bad depth", func(c *Config) { c.PyStackOn, c.PyStack = true, 1001 }, `invalid value "python:1001" for --call-stack: depth must be an integer in [0,1000]`},
		{"bad collect mode", func(c *Config) { c.CollectMode = "x" }, `invalid value "x" for --collect-mode: must be immediate or deferred`},
		{"bad data format", func(c *Config) { c.DataFormat = "" }, `invalid value "" for --data-format: must be csv or db`},
		{"bad log level", func(c *Config) { c.LogLevel = "debug" }, `invalid value "debug" for --log-level: must be info, warn or error`},
		{"bad log mode", func(c *Config) { c.LogMode = "x" }, `invalid value "x" for --log-mode: must be full or rotate`},
		{"bad log files", func(c *Config) { c.LogFiles = 0 }, `invalid value "0" for --log-files: must be an integer in [1,1000]`},
		{"bad log file mb", func(c *Config) { c.LogFileMB = 20000 }, `invalid value "20000" for --log-file-mb: must be an integer in [1,10240]`},
		{"bad output", func(c *Config) { c.Output = "" }, `invalid value "" for --output: must not be empty`},
		{"watch without end", func(c *Config) { c.Watch = &Watch{Start: "a", StartOut: -1} },
			`invalid value "" for --watch: end is required: [start[:out{id}],]end[,full-content]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.edit(&c)
			err := c.Finish()
			if err == nil || err.Error() != tt.want {
				t.Errorf("Finish:\n got %v\nwant %s", err, tt.want)
			}
		})
	}
}

func TestFinishAfterDecode(t *testing.T) {
	c, err := apply(t, "events", "alloc", "analysis", "inefficient", "device", "cuda:1", "watch", "x:out2,y")
	if err != nil {
		t.Fatal(err)
	}
	d, err := Decode(c.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Finish(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, d) {
		t.Errorf("round trip:\n got %s\nwant %s", d.Encode(), c.Encode())
	}
}

func TestCanonicalName(t *testing.T) {
	for _, o := range Options {
		for _, n := range []string{o, strings.ReplaceAll(o, "-", "_")} {
			if got, ok := CanonicalName(n); !ok || got != o {
				t.Errorf("CanonicalName(%q) = %q, %v", n, got, ok)
			}
		}
	}
	if _, ok := CanonicalName("input"); ok {
		t.Error("input is a CLI option only")
	}
}

func TestAbsOutput(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	got, err := AbsOutput("./out/x/")
	if err != nil || got != filepath.Join(wd, "out", "x") {
		t.Errorf("AbsOutput(./out/x/) = %q, %v", got, err)
	}
	got, err = AbsOutput("/abs/dir")
	if err != nil || got != "/abs/dir" {
		t.Errorf("AbsOutput(/abs/dir) = %q, %v", got, err)
	}
	if _, err := AbsOutput(""); err == nil || err.Error() != `invalid value "" for --output: must not be empty` {
		t.Errorf("AbsOutput(\"\") = %v", err)
	}
	// 4096 bytes relative is fine for Set, but too long once absolute.
	rel := strings.Repeat("r", 4096)
	_, err = AbsOutput(rel)
	want := `invalid value "` + strings.TrimSuffix(wd, "/")[:min(64, len(wd))]
	if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.HasSuffix(err.Error(), `for --output: must be at most 4096 bytes once made absolute`) {
		t.Errorf("AbsOutput(4096 bytes) = %v", err)
	}
}

// The hot path learns what it must know from its first event through
// MSMEMSCOPE_HOOK: rotating logs among it (no record may need its thread's
// past there).
func TestHookEnv(t *testing.T) {
	c := Default()
	if got, want := c.Hook().Env(), "heap=1,cstack=0,deferred=0,rotate=0,cuda=4294967295,kernel=0"; got != want {
		t.Errorf("default hook %q, want %q", got, want)
	}
	for _, kv := range [][2]string{{"log-mode", "rotate"}, {"collect-mode", "deferred"}, {"call-stack", "c:16"}} {
		if err := c.Set(kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := c.Hook().Env(), "heap=1,cstack=16,deferred=1,rotate=1,cuda=4294967295,kernel=0"; got != want {
		t.Errorf("hook %q, want %q", got, want)
	}
	// CUDA ordinals one bit each; cuda beside cuda:N means every GPU (SPEC §1).
	for _, tc := range []struct {
		devices, level, want string
	}{
		{"cuda:1,cuda:3", "kernel", ",cuda=10,kernel=1"},
		{"cpu", "op", ",cuda=0,kernel=0"},
		{"cuda:2,cuda", "op", ",cuda=4294967295,kernel=0"},
	} {
		c := Default()
		if err := c.Set("device", tc.devices); err != nil {
			t.Fatal(err)
		}
		if err := c.Set("level", tc.level); err != nil {
			t.Fatal(err)
		}
		if got := c.Hook().Env(); !strings.HasSuffix(got, tc.want) {
			t.Errorf("--device=%s --level=%s: hook %q, want it to end %q", tc.devices, tc.level, got, tc.want)
		}
	}
}
