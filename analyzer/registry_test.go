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

// The inefficient analysis annotating rows on their way to being written
// (the conversion) gives the rows that rewriting the file gives
// (check_inefficient on a dump file), and counts the same results.
func TestInefficientAnnotateMatchesRewrite(t *testing.T) {
	dir := t.TempDir()
	src, _ := ineffStream(3000).write(t, dir, "src")
	rows := readEvents(t, src)
	r, err := CheckInefficient(src, IneffOptions{IdleThreshold: 30}, nil)
	if err != nil || r.Added == 0 {
		t.Fatalf("CheckInefficient: %+v, %v", r, err)
	}
	want := readEvents(t, src)

	s := spec.ByName(spec.Inefficient)
	a, err := New(s.Name, map[string]any{"idle_threshold": 30}, "x")
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		if s.Reads(rows[i].Kind) {
			a.Observe(&rows[i])
		}
	}
	res, err := a.Finish()
	if err != nil {
		t.Fatal(err)
	}
	for i := range rows {
		a.(Annotator).Annotate(&rows[i])
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatal("annotated rows differ from the rewritten file's")
	}
	if got := res.Value.(*IneffReport); got.Added != r.Added || !got.Written {
		t.Fatalf("annotation added %d, the rewrite %d", got.Added, r.Added)
	}
}
