// Package config is the one definition of msmemscope's options (SPEC §1.1):
// their defaults, their rules, and how the effective configuration travels from
// the CLI (or Python's config()) to the library in the traced process.
package config

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// ExportFormats are the formats --export writes (package export).
var ExportFormats = []string{"html", "pprof", "perfetto", "memory_viz"}

// EnvConfig carries the effective configuration, as JSON, to traced processes.
const EnvConfig = "MSMEMSCOPE_CONFIG"

// EnvPyStartup names the folder of the Python startup hook the CLI put on
// PYTHONPATH (python/msmemscope/_startup): the hook acts only where it is
// set, and the library says at exit when -I, -E or -S kept it from loading.
const EnvPyStartup = "MSMEMSCOPE_PY_STARTUP"

// EnvRunID names the CLI run a traced process belongs to; its folder records it
// so the CLI can find every process it traced (SPEC §2 run manifest).
const EnvRunID = "MSMEMSCOPE_RUN_ID"

// Events is the set of optional events (--events).
type Events struct {
	Alloc     bool `json:"alloc"`
	Free      bool `json:"free"`
	Launch    bool `json:"launch"`
	Access    bool `json:"access"`
	Traceback bool `json:"traceback"`
}

// Watch is the parsed --watch option; nil when off.
type Watch struct {
	Start       string `json:"start,omitempty"`
	StartOut    int    `json:"start_out"` // -1: every output
	End         string `json:"end"`
	FullContent bool   `json:"full_content"`
}

// Config is the effective configuration. Zero depths mean "no stack".
type Config struct {
	Devices     []string `json:"devices"` // normalized: "cpu", "cuda", "cuda:N"
	Level       string   `json:"level"`   // "op" | "kernel"
	Events      Events   `json:"events"`
	PyStack     int      `json:"python_stack_depth"` // 0: off
	CStack      int      `json:"c_stack_depth"`      // 0: off
	PyStackOn   bool     `json:"python_stack"`       // python given (depth may be 0)
	CStackOn    bool     `json:"c_stack"`            // c given (depth may be 0)
	CollectMode string   `json:"collect_mode"`       // "immediate" | "deferred"
	Analysis    []string `json:"analysis"`           // subset of leaks, inefficient, decompose
	Steps       []int    `json:"steps"`              // empty: all steps
	Watch       *Watch   `json:"watch,omitempty"`
	DataFormat  string   `json:"data_format"`      // "csv" | "db"
	Export      []string `json:"export,omitempty"` // formats written into export/ (ExportFormats)
	Output      string   `json:"output"`           // absolute once the CLI has checked it
	LogLevel    string   `json:"log_level"`        // "info" | "warn" | "error"
	LogMode     string   `json:"log_mode"`         // "full" | "rotate"
	LogFiles    int      `json:"log_files"`
	LogFileMB   int      `json:"log_file_mb"`
}

// DefaultOutput is the output folder when --output is not given.
const DefaultOutput = "./memscopeDumpResults"

// Default returns the configuration msmemscope uses when no option is given.
func Default() Config {
	return Config{
		Devices:     []string{"cpu", "cuda"},
		Level:       "op",
		Events:      Events{Alloc: true, Free: true, Launch: true},
		CollectMode: "immediate",
		Analysis:    []string{"leaks"},
		DataFormat:  "csv",
		Output:      DefaultOutput,
		LogLevel:    "warn",
		LogMode:     "full",
		LogFiles:    10,
		LogFileMB:   100,
	}
}

// HasDevice reports whether the host heap ("cpu") or a device ("cuda", "cuda:N")
// is collected.
func (c *Config) HasDevice(d string) bool {
	for _, x := range c.Devices {
		if x == d {
			return true
		}
	}
	return false
}

// WantStep reports whether rows of step s are written (--steps).
func (c *Config) WantStep(s int) bool {
	if len(c.Steps) == 0 {
		return true
	}
	for _, x := range c.Steps {
		if x == s {
			return true
		}
	}
	return false
}

// Encode returns the JSON form carried in EnvConfig and written to config.json.
func (c *Config) Encode() string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // only plain fields: cannot fail
	}
	return string(b)
}

// Decode parses the JSON form of Encode.
func Decode(s string) (Config, error) {
	c := Default()
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return c, fmt.Errorf("%s: %v", EnvConfig, err)
	}
	return c, nil
}

// Hook is what the C hot path reads of a configuration: it starts before
// anything in the process can parse JSON (the CLI passes it as MSMEMSCOPE_HOOK).
type Hook struct {
	Heap     bool   // record the host heap
	CStack   int    // C stack depth, 0 off
	PyStack  int    // Python stack depth, 0 off
	Deferred bool   // collect only after start()
	Rotate   bool   // rotating logs: no record may need its thread's past (format/records.def)
	CUDA     uint32 // CUDA ordinals whose driver memory is recorded, one bit each (all: every bit)
	Kernel   bool   // record CUDA kernel launches (--level=kernel)
}

// Hook derives the hot path's settings.
func (c *Config) Hook() Hook {
	h := Hook{Heap: c.HasDevice("cpu") && c.Events.Alloc, Deferred: c.CollectMode == "deferred", Rotate: c.LogMode == "rotate",
		Kernel: c.Level == "kernel"}
	if c.Events.Alloc {
		h.CUDA = c.CUDAMask()
	}
	if c.CStackOn {
		h.CStack = c.CStack
	}
	if c.PyStackOn {
		h.PyStack = c.PyStack
	}
	return h
}

// CUDAMask is the set of CUDA ordinals collected, one bit each: every bit
// for "cuda", bit N for "cuda:N", none without either.
func (c *Config) CUDAMask() uint32 {
	var m uint32
	for _, d := range c.Devices {
		if d == "cuda" {
			return ^uint32(0)
		}
		if n, ok := strings.CutPrefix(d, "cuda:"); ok {
			if i, err := strconv.Atoi(n); err == nil && i >= 0 && i < 32 {
				m |= 1 << i
			}
		}
	}
	return m
}

// Env is the MSMEMSCOPE_HOOK form the C side parses ("heap=1,cstack=16,deferred=0,rotate=0,cuda=4294967295,kernel=0").
func (h Hook) Env() string {
	b := func(v bool) int {
		if v {
			return 1
		}
		return 0
	}
	return fmt.Sprintf("heap=%d,cstack=%d,deferred=%d,rotate=%d,cuda=%d,kernel=%d", b(h.Heap), h.CStack, b(h.Deferred), b(h.Rotate),
		h.CUDA, b(h.Kernel))
}
