package analyzer

import (
	"reflect"
	"testing"

	"msmemscope/analyzer/spec"
	"msmemscope/trace"
)

// Every analysis of the table can be made by name with its defaults, and
// the names users see keep their meanings: --analysis=leaks is the step
// and exit analysis, analyze("leaks") the mark-range one.
func TestRegistryTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range spec.All {
		if seen[s.Name] {
			t.Fatalf("%s twice in the table", s.Name)
		}
		seen[s.Name] = true
		if constructors[s.Name] == nil {
			t.Fatalf("%s has no constructor", s.Name)
		}
		if s.Offline == "" && s.Option == "" {
			t.Fatalf("%s is offered nowhere", s.Name)
		}
		if s.Option == "" {
			continue // needs arguments only an offline call gives
		}
		a, err := New(s.Name, nil, "x")
		if err != nil {
			t.Fatalf("New(%s): %v", s.Name, err)
		}
		a.Observe(&trace.Event{Kind: trace.KindMalloc, ID: 1, AllocID: 1, Size: 8, Type: trace.TypeHost})
		if r, err := a.Finish(); err != nil || r.Summary == nil || r.Value == nil {
			t.Fatalf("%s.Finish() = %+v, %v", s.Name, r, err)
		}
	}
	if spec.ByOption("leaks").Name != spec.StepLeaks || spec.ByOffline("leaks").Name != spec.MarkLeaks {
		t.Fatal("leaks means the step analysis on the CLI and the mark one offline")
	}
	if got := spec.Options(); !reflect.DeepEqual(got, []string{"leaks", "inefficient", "decompose"}) {
		t.Fatalf("Options = %v", got)
	}
	if _, err := New(spec.Inefficient, map[string]any{"idle_threshold": 0}, ""); err == nil {
		t.Fatal("idle_threshold 0 accepted")
	}
	if _, err := New(spec.Inefficient, map[string]any{"input_path": "x"}, ""); err == nil {
		t.Fatal("input_path accepted by a stream analysis")
	}
}
