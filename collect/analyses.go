package collect

import (
	"fmt"
	"slices"

	"msmemscope/analyzer"
	"msmemscope/analyzer/spec"
	"msmemscope/trace"
)

// ConsoleTop is how many findings the console summaries of a conversion or
// of an --analysis on a file list.
const ConsoleTop = 5

// run is one analysis of a conversion.
type run struct {
	spec  *spec.Analysis
	a     analyzer.Analysis
	res   *analyzer.Result
	first bool // it judges in a pass of its own, before the rows are written
}

// newRuns makes the analyses of --analysis values options (in the table's
// order, as config leaves them), with their defaults; input names the dump
// for their reports.
func newRuns(options []string, input string) ([]*run, error) {
	var out []*run
	for _, o := range options {
		s := spec.ByOption(o)
		if s == nil {
			return nil, fmt.Errorf("unknown analysis %q", o)
		}
		a, err := analyzer.New(s.Name, nil, input)
		if err != nil {
			return nil, err
		}
		out = append(out, &run{spec: s, a: a})
	}
	return out, nil
}

// judgeFirst picks the runs that judge in a first pass: those that annotate
// rows, unless the input cannot hold every kind of row they need (then
// they find nothing to annotate, and are fed while the rows are written).
// It reports whether there are any.
func judgeFirst(runs []*run, holds func(trace.Kind) bool) bool {
	found := false
	for _, r := range runs {
		r.first = r.spec.Annotates && !slices.ContainsFunc(r.spec.Needs, func(k trace.Kind) bool { return !holds(k) })
		found = found || r.first
	}
	return found
}

// observe feeds e to the runs of the first pass or the others, those that
// read its kind.
func observe(runs []*run, first bool, e *trace.Event) {
	for _, r := range runs {
		if r.first == first && r.spec.Reads(e.Kind) {
			r.a.Observe(e)
		}
	}
}

// finish finishes the runs of the first pass or the others.
func finish(runs []*run, first bool) error {
	for _, r := range runs {
		if r.first != first {
			continue
		}
		var err error
		if r.res, err = r.a.Finish(); err != nil {
			return err
		}
	}
	return nil
}

// annotate adds the first pass's results to a row about to be written.
func annotate(runs []*run, e *trace.Event) {
	for _, r := range runs {
		if !r.first { // (before the type assertion: this runs for every row)
			continue
		}
		if an, ok := r.a.(analyzer.Annotator); ok {
			an.Annotate(e)
		}
	}
}

// setLeakKinds gives the leaks analysis the kinds the scan at exit found
// (leakscan.Kind by allocation id; nil: no scan ran).
func setExitUnknown(runs []*run, reason string) {
	for _, r := range runs {
		if s, ok := r.a.(interface{ SetExitUnknown(string) }); ok {
			s.SetExitUnknown(reason)
		}
	}
}

// leakKindOf names the leak kinds the scan at exit gave (nil: no scan ran).
func leakKindOf(kinds map[uint64]uint8) func(uint64) (string, bool) {
	if kinds == nil {
		return nil
	}
	return func(id uint64) (string, bool) {
		if k := int(kinds[id]); k >= 1 && k <= len(analyzer.LeakKinds) {
			return analyzer.LeakKinds[k-1], true
		}
		return "", true
	}
}

func setLeakKinds(runs []*run, kinds map[uint64]uint8) {
	kindOf := leakKindOf(kinds)
	if kindOf == nil {
		return
	}
	for _, r := range runs {
		if s, ok := r.a.(interface {
			SetKinds(func(uint64) (string, bool))
		}); ok {
			s.SetKinds(kindOf)
		}
	}
}
