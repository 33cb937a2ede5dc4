package config

// Parsing and checking of options (SPEC §1.1 and §1.2).
//
// The CLI and Python's msmemscope.config() share this code: each option given
// is applied with Config.Set (by name, "call-stack" or "call_stack"), and once
// every option is applied the caller calls Config.Finish exactly once, which
// applies the implications that span options (an analysis switches on the
// events it needs) and checks the result as a whole. Implications therefore
// hold whatever the order the options were given in.
//
// Every violation is an *OptionError whose text is one line:
//
//	invalid value "<value>" for --<option>: <rule>

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"msmemscope/analyzer/spec"
	"msmemscope/trace"
)

// MaxPathBytes is the longest accepted --output or --input path, in bytes.
const MaxPathBytes = 4096

// MaxSteps is the most step ids --steps takes.
const MaxSteps = 5

// Limits of the numeric options.
const (
	MaxStackDepth = 1000
	MaxDeviceID   = 31
	MaxLogFiles   = 1000
	MaxLogFileMB  = 10240
	MaxWatchOut   = 65535
)

// Options lists the names Set accepts, in their canonical (dashed) spelling,
// in the order of SPEC §1.1's table.
var Options = []string{
	"device", "level", "events", "call-stack", "collect-mode", "analysis",
	"steps", "watch", "data-format", "output", "log-level", "log-mode",
	"log-files", "log-file-mb", "export",
}

// OptionError is a value that breaks one of an option's rules. Option is the
// canonical dashed name ("call-stack"); Value is the offending value, the
// whole value given or, for a list, the offending item; Rule says what is
// expected. Python reuses Value and Rule with its own spelling of the name.
type OptionError struct {
	Option string
	Value  string
	Rule   string
}

// maxShownValue is the length beyond which Error abbreviates the value.
const maxShownValue = 256

// Error returns `invalid value "<value>" for --<option>: <rule>`, one line: the
// value is quoted with Go escapes (so a newline in it shows as \n), and a value
// longer than 256 bytes is cut to its first 64 bytes followed by "...".
func (e *OptionError) Error() string {
	v := e.Value
	if len(v) > maxShownValue {
		v = strings.ToValidUTF8(v[:64], "") + "..."
	}
	return fmt.Sprintf("invalid value %q for --%s: %s", v, e.Option, e.Rule)
}

// UnknownOptionError is a name Set does not know.
type UnknownOptionError struct {
	Name string // as given
}

// Error returns `unknown option "<name>"`.
func (e *UnknownOptionError) Error() string {
	return fmt.Sprintf("unknown option %q", e.Name)
}

// CanonicalName maps an option name to its dashed spelling ("call_stack" →
// "call-stack"); ok is false for a name Set does not know.
func CanonicalName(name string) (canonical string, ok bool) {
	n := strings.ReplaceAll(name, "_", "-")
	for _, o := range Options {
		if o == n {
			return n, true
		}
	}
	return "", false
}

// Rules, shared by Set and Finish (and by the tests, which assert the texts).
const (
	ruleDevice       = "must be cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]"
	ruleDeviceEmpty  = "must not be empty: give cpu, cuda, cuda:{id} or npu:{id} with id in [0,31]"
	ruleEmptyItem    = "empty item in the comma-separated list"
	ruleLevel        = "must be op (or 0) or kernel (or 1)"
	ruleEvents       = "must be one of alloc, free, launch, access, traceback"
	ruleCallStack    = "must be python[:depth] or c[:depth], comma-separated"
	ruleDepth        = "depth must be an integer in [0,1000]"
	ruleCollectMode  = "must be immediate or deferred"
	ruleStep         = "step ids must be integers in [1,2147483647]"
	ruleStepsMany    = "at most 5 step ids"
	ruleWatchForm    = "must be [start[:out{id}],]end[,full-content]"
	ruleWatchEnd     = "end is required: [start[:out{id}],]end[,full-content]"
	ruleWatchOutEnd  = "out{id} requires start: [start[:out{id}],]end[,full-content]"
	ruleWatchOutOnly = "out{id} applies to start only: [start[:out{id}],]end[,full-content]"
	ruleWatchFull    = "full-content must come last: [start[:out{id}],]end[,full-content]"
	ruleWatchNth     = "N in #N must be an integer in [1,2147483647]"
	ruleWatchOutID   = "id in out{id} must be an integer in [0,65535]"
	ruleWatchOrder   = "#N goes before out{id}: start[#N][:out{id}]"
	ruleWatchName    = "operator name must not be empty"
	ruleDataFormat   = "must be csv or db"
	ruleExport       = "must be html, pprof, perfetto or memory_viz (the export formats built), comma-separated"
	ruleLogLevel     = "must be info, warn or error"
	ruleLogMode      = "must be full or rotate"
	ruleLogFiles     = "must be an integer in [1,1000]"
	ruleLogFileMB    = "must be an integer in [1,10240]"
	ruleOutputEmpty  = "must not be empty"
	ruleOutputLong   = "must be at most 4096 bytes"
	ruleOutputChars  = "must not contain NUL or newline characters"
	ruleOutputAbs    = "must be at most 4096 bytes once made absolute"
	ruleOutputDash   = "must not begin with '-' (another option taken as its value? a folder so named: ./-name)"
	ruleOutputBlank  = "must not be blank"
)

// Set applies one option by name ("call-stack" or "call_stack"), replacing the
// value it had. It checks the option's own rules; Finish, called once after
// every Set, applies what spans options. An empty value switches the option
// off where the option has an off state (events, call-stack, analysis, steps,
// watch); elsewhere it is an error.
func (c *Config) Set(name, value string) error {
	opt, ok := CanonicalName(name)
	if !ok {
		return &UnknownOptionError{Name: name}
	}
	switch opt {
	case "device":
		d, err := parseDevices(value)
		if err != nil {
			return err
		}
		c.Devices = d
	case "level":
		switch strings.TrimSpace(value) {
		case "op", "0":
			c.Level = "op"
		case "kernel", "1":
			c.Level = "kernel"
		default:
			return &OptionError{opt, value, ruleLevel}
		}
	case "events":
		e, err := parseEvents(value)
		if err != nil {
			return err
		}
		c.Events = e
	case "call-stack":
		return c.setCallStack(value)
	case "collect-mode":
		v, err := oneOf(opt, value, ruleCollectMode, "immediate", "deferred")
		if err != nil {
			return err
		}
		c.CollectMode = v
	case "analysis":
		a, err := parseAnalysis(value)
		if err != nil {
			return err
		}
		c.Analysis = a
	case "steps":
		s, err := parseSteps(value)
		if err != nil {
			return err
		}
		c.Steps = s
	case "watch":
		w, err := parseWatch(value)
		if err != nil {
			return err
		}
		c.Watch = w
	case "export":
		items, err := splitItems(opt, value)
		if err != nil {
			return err
		}
		var out []string
		for _, it := range items {
			if !slices.Contains(ExportFormats, it) {
				return &OptionError{opt, it, ruleExport}
			}
			if !slices.Contains(out, it) {
				out = append(out, it)
			}
		}
		c.Export = out
	case "data-format":
		v, err := oneOf(opt, value, ruleDataFormat, "csv", "db")
		if err != nil {
			return err
		}
		c.DataFormat = v
	case "output":
		if err := checkOutput(value); err != nil {
			return err
		}
		c.Output = value
	case "log-level":
		v, err := oneOf(opt, value, ruleLogLevel, "info", "warn", "error")
		if err != nil {
			return err
		}
		c.LogLevel = v
	case "log-mode":
		v, err := oneOf(opt, value, ruleLogMode, "full", "rotate")
		if err != nil {
			return err
		}
		c.LogMode = v
	case "log-files":
		n, ok := parseUint(strings.TrimSpace(value), 1, MaxLogFiles)
		if !ok {
			return &OptionError{opt, value, ruleLogFiles}
		}
		c.LogFiles = n
	case "log-file-mb":
		n, ok := parseUint(strings.TrimSpace(value), 1, MaxLogFileMB)
		if !ok {
			return &OptionError{opt, value, ruleLogFileMB}
		}
		c.LogFileMB = n
	}
	return nil
}

// Finish applies the implications between options and checks the whole
// configuration. Call it once, after every Set (it is idempotent, so calling
// it again after more Sets is harmless):
//
//   - events: alloc implies free and vice versa; access implies both;
//   - analysis: an analysis implies the events of the rows it needs
//     (analyzer/spec): leaks and decompose alloc,free; inefficient
//     alloc,free,access,launch;
//   - every field holds a value its option accepts (this also catches a
//     Config built by hand or decoded from JSON); Devices, Analysis and Steps
//     are put in their normal form.
func (c *Config) Finish() error {
	for _, name := range c.Analysis {
		a := spec.ByOption(name)
		if a == nil {
			return &OptionError{"analysis", name, ruleAnalysis}
		}
		for _, k := range a.Needs {
			c.Events.record(k)
		}
	}
	c.Events.imply()

	d, err := parseDevices(strings.Join(c.Devices, ","))
	if err != nil {
		return err
	}
	c.Devices = d
	a, err := parseAnalysis(strings.Join(c.Analysis, ","))
	if err != nil {
		return err
	}
	c.Analysis = a
	steps := make([]string, len(c.Steps))
	for i, s := range c.Steps {
		steps[i] = strconv.Itoa(s)
	}
	s, err := parseSteps(strings.Join(steps, ","))
	if err != nil {
		return err
	}
	c.Steps = s

	switch c.Level {
	case "op", "kernel":
	default:
		return &OptionError{"level", c.Level, ruleLevel}
	}
	if c.PyStack < 0 || c.PyStack > MaxStackDepth {
		return &OptionError{"call-stack", "python:" + strconv.Itoa(c.PyStack), ruleDepth}
	}
	if c.CStack < 0 || c.CStack > MaxStackDepth {
		return &OptionError{"call-stack", "c:" + strconv.Itoa(c.CStack), ruleDepth}
	}
	if !c.PyStackOn {
		c.PyStack = 0
	}
	if !c.CStackOn {
		c.CStack = 0
	}
	checks := []struct{ opt, v, rule string }{
		{"collect-mode", c.CollectMode, ruleCollectMode},
		{"data-format", c.DataFormat, ruleDataFormat},
		{"log-level", c.LogLevel, ruleLogLevel},
		{"log-mode", c.LogMode, ruleLogMode},
	}
	allowed := map[string][]string{
		"collect-mode": {"immediate", "deferred"},
		"data-format":  {"csv", "db"},
		"log-level":    {"info", "warn", "error"},
		"log-mode":     {"full", "rotate"},
	}
	for _, k := range checks {
		if _, err := oneOf(k.opt, k.v, k.rule, allowed[k.opt]...); err != nil || k.v != strings.TrimSpace(k.v) {
			return &OptionError{k.opt, k.v, k.rule}
		}
	}
	if c.LogFiles < 1 || c.LogFiles > MaxLogFiles {
		return &OptionError{"log-files", strconv.Itoa(c.LogFiles), ruleLogFiles}
	}
	if c.LogFileMB < 1 || c.LogFileMB > MaxLogFileMB {
		return &OptionError{"log-file-mb", strconv.Itoa(c.LogFileMB), ruleLogFileMB}
	}
	if err := checkOutput(c.Output); err != nil {
		return err
	}
	if w := c.Watch; w != nil {
		if w.End == "" {
			return &OptionError{"watch", "", ruleWatchEnd}
		}
		if w.StartOut >= 0 && w.Start == "" {
			return &OptionError{"watch", w.End, ruleWatchOutEnd}
		}
	}
	return nil
}

// AbsOutput returns p made absolute (and cleaned), checking that it still
// obeys --output's rules.
func AbsOutput(p string) (string, error) {
	if err := checkOutput(p); err != nil {
		return "", err
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", &OptionError{"output", p, "cannot be made absolute: " + oneLine(err.Error())}
	}
	if len(abs) > MaxPathBytes {
		return "", &OptionError{"output", abs, ruleOutputAbs}
	}
	return abs, nil
}

// CheckPath checks a path given to an option (--output, --input): non-empty,
// at most 4096 bytes, no NUL or newline characters.
func CheckPath(option, p string) error {
	switch {
	case p == "":
		return &OptionError{option, p, ruleOutputEmpty}
	case len(p) > MaxPathBytes:
		return &OptionError{option, p, ruleOutputLong}
	case strings.ContainsAny(p, "\x00\n\r"):
		return &OptionError{option, p, ruleOutputChars}
	}
	return nil
}

// checkOutput is CheckPath, and a folder to be made: "--output --steps=1"
// made a folder named "--steps=1", "--output=' '" one named " ".
func checkOutput(p string) error {
	if err := CheckPath("output", p); err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(p, "-"):
		return &OptionError{"output", p, ruleOutputDash}
	case strings.TrimSpace(p) == "":
		return &OptionError{"output", p, ruleOutputBlank}
	}
	return nil
}

// SplitList splits a comma-separated value on ASCII "," and full-width "，",
// trimming white space around each item. An empty (or all-blank) value is no
// items.
func SplitList(v string) []string {
	v = strings.ReplaceAll(v, "，", ",")
	if strings.TrimSpace(v) == "" {
		return nil
	}
	items := strings.Split(v, ",")
	for i := range items {
		items[i] = strings.TrimSpace(items[i])
	}
	return items
}

// splitItems is SplitList that refuses an empty item ("a,,b", "a,").
func splitItems(opt, v string) ([]string, error) {
	items := SplitList(v)
	for _, it := range items {
		if it == "" {
			return nil, &OptionError{opt, v, ruleEmptyItem}
		}
	}
	return items, nil
}

func oneOf(opt, v, rule string, allowed ...string) (string, error) {
	t := strings.TrimSpace(v)
	for _, a := range allowed {
		if t == a {
			return a, nil
		}
	}
	return "", &OptionError{opt, v, rule}
}

// parseUint parses a decimal integer made of digits only (no sign, no blanks)
// in [lo,hi].
func parseUint(s string, lo, hi int) (int, bool) {
	if s == "" || len(s) > 10 {
		return 0, false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < int64(lo) || n > int64(hi) {
		return 0, false
	}
	return int(n), true
}

// parseDevices returns the normal form of --device: "cpu" first, then "cuda"
// or the "cuda:N" in ascending order, each once; "cuda" absorbs every
// "cuda:N"; npu is an alias of cuda.
func parseDevices(v string) ([]string, error) {
	items, err := splitItems("device", v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, &OptionError{"device", v, ruleDeviceEmpty}
	}
	var cpu, all bool
	var ids [MaxDeviceID + 1]bool
	for _, it := range items {
		switch it {
		case "cpu":
			cpu = true
		case "cuda", "npu":
			all = true
		default:
			kind, id, found := strings.Cut(it, ":")
			if !found || (kind != "cuda" && kind != "npu") {
				return nil, &OptionError{"device", it, ruleDevice}
			}
			n, ok := parseUint(id, 0, MaxDeviceID)
			if !ok {
				return nil, &OptionError{"device", it, ruleDevice}
			}
			ids[n] = true
		}
	}
	var out []string
	if cpu {
		out = append(out, "cpu")
	}
	if all {
		return append(out, "cuda"), nil
	}
	for n, on := range ids {
		if on {
			out = append(out, "cuda:"+strconv.Itoa(n))
		}
	}
	return out, nil
}

func (e *Events) imply() {
	if e.Access {
		e.Alloc, e.Free = true, true
	}
	if e.Alloc || e.Free {
		e.Alloc, e.Free = true, true
	}
}

// record switches on the events whose rows are of kind k (the kinds an
// analysis needs); rows of other kinds (system, mstx) are always recorded.
func (e *Events) record(k trace.Kind) {
	switch k {
	case trace.KindMalloc:
		e.Alloc = true
	case trace.KindFree:
		e.Free = true
	case trace.KindAccess:
		e.Access = true
	case trace.KindOpLaunch:
		e.Launch = true
	}
}

func parseEvents(v string) (Events, error) {
	var e Events
	items, err := splitItems("events", v)
	if err != nil {
		return e, err
	}
	for _, it := range items {
		switch it {
		case "alloc":
			e.Alloc = true
		case "free":
			e.Free = true
		case "launch":
			e.Launch = true
		case "access":
			e.Access = true
		case "traceback":
			e.Traceback = true
		default:
			return e, &OptionError{"events", it, ruleEvents}
		}
	}
	e.imply()
	return e, nil
}

func (c *Config) setCallStack(v string) error {
	items, err := splitItems("call-stack", v)
	if err != nil {
		return err
	}
	var py, cc bool
	pyDepth, cDepth := 0, 0
	for _, it := range items {
		kind, ds, hasDepth := strings.Cut(it, ":")
		depth := 50
		if hasDepth {
			n, ok := parseUint(ds, 0, MaxStackDepth)
			if !ok {
				if kind != "python" && kind != "c" {
					return &OptionError{"call-stack", it, ruleCallStack}
				}
				return &OptionError{"call-stack", it, ruleDepth}
			}
			depth = n
		}
		switch kind {
		case "python":
			if py {
				return &OptionError{"call-stack", v, "python given twice"}
			}
			py, pyDepth = true, depth
		case "c":
			if cc {
				return &OptionError{"call-stack", v, "c given twice"}
			}
			cc, cDepth = true, depth
		default:
			return &OptionError{"call-stack", it, ruleCallStack}
		}
	}
	c.PyStackOn, c.PyStack = py, pyDepth
	c.CStackOn, c.CStack = cc, cDepth
	return nil
}

// ruleAnalysis names the --analysis values of the analyses' table.
var ruleAnalysis = "must be one of " + strings.Join(spec.Options(), ", ")

// parseAnalysis returns the analyses in the table's order (leaks,
// inefficient, decompose), each once.
func parseAnalysis(v string) ([]string, error) {
	items, err := splitItems("analysis", v)
	if err != nil {
		return nil, err
	}
	on := map[string]bool{}
	for _, it := range items {
		if spec.ByOption(it) == nil {
			return nil, &OptionError{"analysis", it, ruleAnalysis}
		}
		on[it] = true
	}
	out := []string{}
	for _, a := range spec.Options() {
		if on[a] {
			out = append(out, a)
		}
	}
	return out, nil
}

// parseSteps returns the step ids in ascending order; nil for an empty value
// (every step).
func parseSteps(v string) ([]int, error) {
	items, err := splitItems("steps", v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > MaxSteps {
		return nil, &OptionError{"steps", v, ruleStepsMany}
	}
	seen := map[int]bool{}
	var out []int
	for _, it := range items {
		n, ok := parseUint(it, 1, 1<<31-1)
		if !ok {
			return nil, &OptionError{"steps", it, ruleStep}
		}
		if seen[n] {
			return nil, &OptionError{"steps", v, fmt.Sprintf("step id %d given twice", n)}
		}
		seen[n] = true
		out = append(out, n)
	}
	sort.Ints(out)
	return out, nil
}

// outSuffix matches a trailing ":out{id}" (digits only, so "aten::outer" is a
// name, not an output selector).
var outSuffix = regexp.MustCompile(`^(.*[^:]):out([0-9]+)$`)

// parseWatch parses [start[:out{id}],]end[,full-content]. Names keep their
// "#N" (N-th launch) suffix; out{id} is taken off start into StartOut.
func parseWatch(v string) (*Watch, error) {
	items, err := splitItems("watch", v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, nil
	}
	w := &Watch{StartOut: -1}
	if items[len(items)-1] == "full-content" {
		w.FullContent = true
		items = items[:len(items)-1]
	}
	for _, it := range items {
		if it == "full-content" {
			return nil, &OptionError{"watch", v, ruleWatchFull}
		}
	}
	switch len(items) {
	case 0:
		return nil, &OptionError{"watch", v, ruleWatchEnd}
	case 1, 2:
	default:
		return nil, &OptionError{"watch", v, ruleWatchForm}
	}
	end := items[len(items)-1]
	if outSuffix.MatchString(end) {
		if len(items) == 1 {
			return nil, &OptionError{"watch", v, ruleWatchOutEnd}
		}
		return nil, &OptionError{"watch", v, ruleWatchOutOnly}
	}
	if err := checkOpName(end); err != nil {
		return nil, err
	}
	w.End = end
	if len(items) == 2 {
		start := items[0]
		if m := outSuffix.FindStringSubmatch(start); m != nil {
			n, ok := parseUint(m[2], 0, MaxWatchOut)
			if !ok {
				return nil, &OptionError{"watch", start, ruleWatchOutID}
			}
			start, w.StartOut = m[1], n
		}
		if err := checkOpName(start); err != nil {
			return nil, err
		}
		w.Start = start
	}
	return w, nil
}

// checkOpName checks an operator name with its optional "#N" suffix.
func checkOpName(s string) error {
	name := s
	if i := strings.LastIndexByte(s, '#'); i >= 0 {
		name = s[:i]
		if _, ok := parseUint(s[i+1:], 1, 1<<31-1); !ok {
			return &OptionError{"watch", s, ruleWatchNth}
		}
		if outSuffix.MatchString(name) {
			return &OptionError{"watch", s, ruleWatchOrder}
		}
	}
	if name == "" {
		return &OptionError{"watch", s, ruleWatchName}
	}
	return nil
}

func oneLine(s string) string {
	return strings.NewReplacer("\n", " ", "\r", " ").Replace(s)
}
