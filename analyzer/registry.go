package analyzer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"sort"
	"strings"
	"syscall"

	"msmemscope/internal/safefs"
)

// The offline analyzers of SPEC §6, by name, with their parameters: what
// list_analyzers and get_analyzer_config show, and the checks analyze
// applies to keyword arguments (the Python functions are thin calls into
// RunAnalyzer through the C API).

// Param describes one parameter of an analyzer.
type Param struct {
	Name        string `json:"-"`
	Type        string `json:"type"` // Python's spelling: "str", "int", "Optional[str]", "Optional[List[str]]"
	Required    bool   `json:"required"`
	Default     any    `json:"default"`
	Description string `json:"description"`
}

type analyzerSpec struct {
	name   string
	params []Param
}

var analyzerSpecs = []analyzerSpec{
	{"leaks", []Param{
		{Name: "input_path", Type: "str", Required: true, Description: "a memscope_dump CSV or DB file written by msmemscope"},
		{Name: "mstx_info", Type: "str", Required: true, Description: "the message of the mstx marks that delimit the range (mstxMarkA / msmemscope.mstx.mark)"},
		{Name: "start_index", Type: "int", Required: true, Description: "which mark (from 0, among those with that message) is A; the next two are B and C. Blocks allocated between A and B and not freed before C are leaks"},
		{Name: "event_type", Type: "Optional[str]", Default: nil, Description: "only MALLOCs of this Event Type (HOST, MMAP, PTA, HAL, ...); None: every type"},
	}},
	{"inefficient", []Param{
		{Name: "input_path", Type: "str", Required: true, Description: "a memscope_dump CSV or DB file written by msmemscope; results are added to its MALLOC rows"},
		{Name: "mem_size", Type: "int", Default: 0, Description: "size floor in bytes: smaller blocks are not judged"},
		{Name: "inefficient_type", Type: "Optional[List[str]]", Default: nil, Description: "types to look for: early_allocation, late_deallocation, temporary_idleness; None: all three"},
		{Name: "idle_threshold", Type: "int", Default: DefaultIdleThreshold, Description: "temporary_idleness: more than this many apis between two accesses of a block"},
	}},
}

// ListAnalyzers returns the analyzers' names.
func ListAnalyzers() []string {
	names := make([]string, len(analyzerSpecs))
	for i, s := range analyzerSpecs {
		names[i] = s.name
	}
	return names
}

func findSpec(name string) (*analyzerSpec, error) {
	for i := range analyzerSpecs {
		if analyzerSpecs[i].name == name {
			return &analyzerSpecs[i], nil
		}
	}
	return nil, &ArgError{Kind: "ValueError", Msg: fmt.Sprintf("unknown analyzer %q: available analyzers are %s", name, strings.Join(ListAnalyzers(), ", "))}
}

// AnalyzerConfig returns an analyzer's parameters by name.
func AnalyzerConfig(name string) (map[string]Param, error) {
	s, err := findSpec(name)
	if err != nil {
		return nil, err
	}
	m := make(map[string]Param, len(s.params))
	for _, p := range s.params {
		m[p.Name] = p
	}
	return m, nil
}

// AnalyzerParams returns an analyzer's parameter names in order.
func AnalyzerParams(name string) ([]string, error) {
	s, err := findSpec(name)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range s.params {
		names = append(names, p.Name)
	}
	return names, nil
}

// ArgError is a bad call: Kind is the Python exception it becomes
// (TypeError, ValueError, FileNotFoundError, IsADirectoryError,
// PermissionError).
type ArgError struct {
	Kind string
	Msg  string
}

func (e *ArgError) Error() string { return e.Msg }

// ErrorKind names the Python exception for err.
func ErrorKind(err error) string {
	var ae *ArgError
	switch {
	case errors.As(err, &ae):
		return ae.Kind
	case errors.Is(err, syscall.EISDIR):
		return "IsADirectoryError"
	case errors.Is(err, fs.ErrNotExist):
		return "FileNotFoundError"
	case errors.Is(err, fs.ErrPermission):
		return "PermissionError"
	}
	return "ValueError"
}

// Result is what RunAnalyzer returns: the structured result and the console
// report.
type Result struct {
	Value any
	Text  string
}

// RunAnalyzer runs analyzer name with keyword arguments as decoded from JSON
// (json.Number for numbers).
func RunAnalyzer(name string, kwargs map[string]any, prog *Progress) (*Result, error) {
	s, err := findSpec(name)
	if err != nil {
		return nil, err
	}
	args, err := bindArgs(s, kwargs)
	if err != nil {
		return nil, err
	}
	path := args["input_path"].(string)
	if err := safefs.CheckPath(path); err != nil {
		return nil, &ArgError{Kind: "ValueError", Msg: "input_path: " + err.Error()}
	}
	switch name {
	case "leaks":
		opt := MarkLeakOptions{MstxInfo: args["mstx_info"].(string), StartIndex: int(args["start_index"].(int64))}
		if v, ok := args["event_type"].(string); ok {
			opt.EventType = v
		}
		if strings.TrimSpace(opt.MstxInfo) == "" {
			return nil, &ArgError{Kind: "ValueError", Msg: "mstx_info must not be empty or blank"}
		}
		if opt.StartIndex < 0 {
			return nil, &ArgError{Kind: "ValueError", Msg: fmt.Sprintf("start_index must be a non-negative integer, got %d", opt.StartIndex)}
		}
		r, err := CheckLeaks(path, opt, prog)
		if err != nil {
			return nil, err
		}
		return &Result{Value: r, Text: r.Summary(20)}, nil
	case "inefficient":
		opt := IneffOptions{IdleThreshold: DefaultIdleThreshold}
		ms := args["mem_size"].(int64)
		if ms < 0 {
			return nil, &ArgError{Kind: "ValueError", Msg: fmt.Sprintf("mem_size must be a non-negative integer, got %d", ms)}
		}
		opt.MemSize = uint64(ms)
		it := args["idle_threshold"].(int64)
		if it <= 0 {
			return nil, &ArgError{Kind: "ValueError", Msg: fmt.Sprintf("idle_threshold must be a positive integer, got %d", it)}
		}
		opt.IdleThreshold = uint64(it)
		if v, ok := args["inefficient_type"].([]string); ok {
			if len(v) == 0 {
				return nil, &ArgError{Kind: "ValueError", Msg: "inefficient_type must not be empty: give one or more of " + strings.Join(IneffTypes, ", ") + ", or None for all"}
			}
			if err := CheckIneffTypes(v); err != nil {
				return nil, &ArgError{Kind: "ValueError", Msg: err.Error()}
			}
			for _, t := range IneffTypes { // canonical order, no repeats
				if slices.Contains(v, t) {
					opt.Types = append(opt.Types, t)
				}
			}
		}
		r, err := CheckInefficient(path, opt, prog)
		if err != nil {
			return nil, err
		}
		text := r.Summary(10)
		res := r
		return &Result{Value: res, Text: text}, nil
	}
	return nil, &ArgError{Kind: "ValueError", Msg: "unknown analyzer " + name}
}

// bindArgs checks kwargs against the parameters: every required one given,
// no unknown one, each of its type; defaults filled in. Values come out as
// string, int64, []string or nil.
func bindArgs(s *analyzerSpec, kwargs map[string]any) (map[string]any, error) {
	out := map[string]any{}
	var unknown []string
	for k := range kwargs {
		if !slices.ContainsFunc(s.params, func(p Param) bool { return p.Name == k }) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, &ArgError{Kind: "TypeError", Msg: fmt.Sprintf("%s got an unexpected keyword argument %q (its parameters: %s)", s.name, unknown[0], paramNames(s))}
	}
	for _, p := range s.params {
		v, given := kwargs[p.Name]
		if !given {
			if p.Required {
				return nil, &ArgError{Kind: "TypeError", Msg: fmt.Sprintf("%s missing required argument %q", s.name, p.Name)}
			}
			v = p.Default
		}
		c, err := convertArg(p, v)
		if err != nil {
			return nil, err
		}
		out[p.Name] = c
	}
	return out, nil
}

func paramNames(s *analyzerSpec) string {
	var n []string
	for _, p := range s.params {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}

func convertArg(p Param, v any) (any, error) {
	bad := func() error {
		return &ArgError{Kind: "TypeError", Msg: fmt.Sprintf("%s must be %s, got %s", p.Name, pyTypeName(p.Type), jsonTypeName(v))}
	}
	optional := strings.HasPrefix(p.Type, "Optional[")
	if v == nil {
		if optional {
			return nil, nil
		}
		return nil, bad()
	}
	switch p.Type {
	case "str", "Optional[str]":
		s, ok := v.(string)
		if !ok {
			return nil, bad()
		}
		return s, nil
	case "int":
		switch n := v.(type) {
		case json.Number:
			i, err := n.Int64()
			if err != nil {
				return nil, bad()
			}
			return i, nil
		case int:
			return int64(n), nil
		case int64:
			return n, nil
		case float64:
			if n == math.Trunc(n) && math.Abs(n) < 1<<53 {
				return int64(n), nil
			}
		}
		return nil, bad()
	case "Optional[List[str]]":
		switch x := v.(type) {
		case string:
			return []string{x}, nil
		case []string:
			return x, nil
		case []any:
			out := make([]string, 0, len(x))
			for _, e := range x {
				s, ok := e.(string)
				if !ok {
					return nil, bad()
				}
				out = append(out, s)
			}
			return out, nil
		}
		return nil, bad()
	}
	return nil, bad()
}

func pyTypeName(t string) string {
	switch t {
	case "str":
		return "a str"
	case "Optional[str]":
		return "a str or None"
	case "int":
		return "an int"
	case "Optional[List[str]]":
		return "a list of str, a str or None"
	}
	return t
}

func jsonTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case string:
		return "str"
	case json.Number, float64:
		return "a number that is not an int"
	case []any:
		return "a list holding a non-str"
	case map[string]any:
		return "dict"
	}
	return fmt.Sprintf("%T", v)
}
