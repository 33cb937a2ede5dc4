package collect

import (
	"fmt"

	"msmemscope/analyzer"
	"msmemscope/analyzer/spec"
	"msmemscope/trace"
)

// ConsoleTop is how many findings the console summaries of a conversion or
// of an --analysis on a file list.
const ConsoleTop = 5

// run is one analysis of a conversion.
type run struct {
	spec *spec.Analysis
	a    analyzer.Analysis
	res  *analyzer.Result
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

// observe feeds e to the runs that read its kind, annotating ones or the
// others.
func observe(runs []*run, annotating bool, e *trace.Event) {
	for _, r := range runs {
		if r.spec.Annotates == annotating && r.spec.Reads(e.Kind) {
			r.a.Observe(e)
		}
	}
}

// finish finishes the runs, annotating ones or the others.
func finish(runs []*run, annotating bool) error {
	for _, r := range runs {
		if r.spec.Annotates != annotating {
			continue
		}
		var err error
		if r.res, err = r.a.Finish(); err != nil {
			return err
		}
	}
	return nil
}

func anyAnnotates(runs []*run) bool {
	for _, r := range runs {
		if r.spec.Annotates {
			return true
		}
	}
	return false
}

// annotate adds the annotating runs' results to a row about to be written.
func annotate(runs []*run, e *trace.Event) {
	for _, r := range runs {
		if an, ok := r.a.(analyzer.Annotator); ok && r.spec.Annotates {
			an.Annotate(e)
		}
	}
}
