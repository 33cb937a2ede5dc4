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

	"msmemscope/analyzer/spec"
)

// Keyword arguments of the offline calls: checked against an analysis's
// parameters (spec.Param), defaults filled in, and the error each bad call
// becomes in Python.

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

// bindArgs checks kwargs against the parameters: every required one given,
// no unknown one, each of its type; defaults filled in. Values come out as
// string, int64, []string or nil. Without withInput the input parameter is
// left out: the caller feeds the events itself.
func bindArgs(s *spec.Analysis, kwargs map[string]any, withInput bool) (map[string]any, error) {
	params := s.Params
	if !withInput {
		params = slices.DeleteFunc(slices.Clone(params), func(p spec.Param) bool { return p.Name == spec.InputParam })
	}
	out := map[string]any{}
	var unknown []string
	for k := range kwargs {
		if !slices.ContainsFunc(params, func(p spec.Param) bool { return p.Name == k }) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, &ArgError{Kind: "TypeError", Msg: fmt.Sprintf("%s got an unexpected keyword argument %q (its parameters: %s)", shownName(s), unknown[0], paramNames(params))}
	}
	for _, p := range params {
		v, given := kwargs[p.Name]
		if !given {
			if p.Required {
				return nil, &ArgError{Kind: "TypeError", Msg: fmt.Sprintf("%s missing required argument %q", shownName(s), p.Name)}
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

// shownName is the name users know an analysis by.
func shownName(s *spec.Analysis) string {
	if s.Offline != "" {
		return s.Offline
	}
	return s.Option
}

func paramNames(params []spec.Param) string {
	var n []string
	for _, p := range params {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}

func convertArg(p spec.Param, v any) (any, error) {
	bad := func() error {
		return &ArgError{Kind: "TypeError", Msg: fmt.Sprintf("%s must be %s, got %s", p.Name, pyTypeName(p.Type), jsonValueName(v))}
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

// jsonValueName says what a Python caller passed: its type, and the value
// when it is short.
func jsonValueName(v any) string {
	switch n := v.(type) {
	case nil:
		return "None"
	case bool:
		if n {
			return "bool True"
		}
		return "bool False"
	case string:
		if len(n) <= 40 {
			return fmt.Sprintf("str %q", n)
		}
		return "str"
	case json.Number:
		if _, err := n.Int64(); err == nil {
			return "int " + n.String()
		}
		return "float " + n.String()
	case float64:
		if n == math.Trunc(n) {
			return fmt.Sprintf("int %.0f", n)
		}
		return fmt.Sprintf("float %g", n)
	case []any:
		return "a list holding a non-str"
	case map[string]any:
		return "dict"
	}
	return fmt.Sprintf("%T", v)
}
