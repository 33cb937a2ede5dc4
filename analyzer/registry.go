package analyzer

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"msmemscope/analyzer/spec"
	"msmemscope/internal/safefs"
	"msmemscope/spool"
	"msmemscope/trace"
)

// The registry: every analysis is an Analysis made by name from the table
// in analyzer/spec (names, parameters, defaults, the rows it reads). The
// conversion, the CLI and the C API's offline calls (list_analyzers,
// get_analyzer_config, analyze: Python's msmemscope.offline) all go
// through it.

// Param describes one parameter of an analysis.
type Param = spec.Param

// Analysis is one analysis over a stream of events: it is fed the rows of
// the kinds it reads (spec.Analysis.Reads), then finished once. The events
// are reused: an analysis copies what it keeps of e, never e itself.
type Analysis interface {
	Observe(e *trace.Event)
	Finish() (*Result, error)
}

// Annotator is an Analysis that writes its results into rows. Once it is
// finished, Annotate adds them to each row on its way to being written
// (rows in ID order, those it was fed): it must see every row it judges
// before any is written.
type Annotator interface {
	Analysis
	Annotate(e *trace.Event)
}

// fileRunner is an Analysis with its own way over a dump file: reading only
// what it needs, or adding its results to the file.
type fileRunner interface {
	runFile(path string, prog *Progress) (*Result, error)
}

// Result is what an analysis found.
type Result struct {
	Value any    // the report: the offline call's result
	Text  string // the offline call's console report (RunAnalyzer)
	// Summary is the console report listing top findings at most.
	Summary func(top int) string
	// File names the report file ("leaks_" + timestamp + ".csv") that
	// WriteCSV writes; "" when the analysis writes none.
	File     string
	WriteCSV func(io.Writer) error
}

// newFunc makes an analysis from its bound parameters; input names what it
// reads, for its report.
type newFunc func(args map[string]any, input string) (Analysis, error)

var constructors = map[string]newFunc{
	spec.StepLeaks:   func(map[string]any, string) (Analysis, error) { return &stepLeaks{NewLeakAnalyzer()}, nil },
	spec.MarkLeaks:   newMarkLeaks,
	spec.Inefficient: newInefficient,
	spec.Decompose:   func(map[string]any, string) (Analysis, error) { return &decompose{NewDecomposeAnalyzer()}, nil },
}

// New makes the analysis of internal name name (spec.StepLeaks, ...) with
// keyword arguments kwargs (defaults for those missing; its input parameter
// left out); input names what it will be fed, for its report.
func New(name string, kwargs map[string]any, input string) (Analysis, error) {
	s := spec.ByName(name)
	if s == nil {
		return nil, fmt.Errorf("unknown analysis %q", name)
	}
	args, err := bindArgs(s, kwargs, false)
	if err != nil {
		return nil, err
	}
	return constructors[name](args, input)
}

// ListAnalyzers returns the offline analyses' names (list_analyzers()).
func ListAnalyzers() []string { return spec.OfflineNames() }

func findOffline(name string) (*spec.Analysis, error) {
	if s := spec.ByOffline(name); s != nil {
		return s, nil
	}
	return nil, &ArgError{Kind: "ValueError", Msg: fmt.Sprintf("unknown analyzer %q: available analyzers are %s", name, strings.Join(ListAnalyzers(), ", "))}
}

// AnalyzerConfig returns an offline analysis's parameters by name.
func AnalyzerConfig(name string) (map[string]Param, error) {
	s, err := findOffline(name)
	if err != nil {
		return nil, err
	}
	m := make(map[string]Param, len(s.Params))
	for _, p := range s.Params {
		m[p.Name] = p
	}
	return m, nil
}

// AnalyzerParams returns an offline analysis's parameter names in order.
func AnalyzerParams(name string) ([]string, error) {
	s, err := findOffline(name)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range s.Params {
		names = append(names, p.Name)
	}
	return names, nil
}

// Label is what progress shows while the offline analysis name runs.
func Label(name string) string {
	if s := spec.ByOffline(name); s != nil && s.Label != "" {
		return s.Label
	}
	return name
}

// RunAnalyzer runs the offline analysis name (analyze()) with keyword
// arguments as decoded from JSON (json.Number for numbers) over the file
// its input parameter names.
func RunAnalyzer(name string, kwargs map[string]any, prog *Progress) (*Result, error) {
	s, err := findOffline(name)
	if err != nil {
		return nil, err
	}
	args, err := bindArgs(s, kwargs, true)
	if err != nil {
		return nil, err
	}
	path := args[spec.InputParam].(string)
	if err := safefs.CheckPath(path); err != nil {
		return nil, &ArgError{Kind: "ValueError", Msg: spec.InputParam + ": " + err.Error()}
	}
	a, err := constructors[s.Name](args, path)
	if err != nil {
		return nil, err
	}
	var r *Result
	if fr, ok := a.(fileRunner); ok {
		r, err = fr.runFile(path, prog)
	} else {
		r, err = RunFile(path, []*spec.Analysis{s}, []Analysis{a}, prog)
	}
	if err != nil {
		return nil, err
	}
	r.Text = r.Summary(s.Top)
	return r, nil
}

// RunFile feeds the analyses (as made for specs) a dump file's rows, those
// of the kinds each reads, in one pass, numbering steps first when one of
// them reads steps; it returns the first one's result.
func RunFile(path string, specs []*spec.Analysis, as []Analysis, prog *Progress) (*Result, error) {
	res, err := RunFileAll(path, specs, as, prog)
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// RunFileAll is RunFile returning every analysis's result.
func RunFileAll(path string, specs []*spec.Analysis, as []Analysis, prog *Progress) ([]*Result, error) {
	defer prog.Done()
	var kinds []trace.Kind
	steps := false
	for _, s := range specs {
		steps = steps || s.Steps
		kinds = append(kinds, s.Needs...)
	}
	if steps {
		kinds = nil // every row
	}
	stepCalls := false
	if steps {
		pre, err := spool.Open(path, trace.OpenOptions{Lean: true, Reuse: true})
		if err != nil {
			return nil, err
		}
		stepCalls, err = trace.ScanStepCalls(pre)
		pre.Close()
		if err != nil {
			return nil, err
		}
	}
	in, err := spool.Open(path, trace.OpenOptions{Reuse: true, Kinds: slices.Compact(kinds)})
	if err != nil {
		return nil, err
	}
	defer in.Close()
	prog.Track(in)
	var s trace.Stream = in
	if steps {
		s = trace.WithSteps(in, &trace.StepTracker{UseStepCalls: stepCalls})
	}
	err = trace.Each(s, func(e *trace.Event) error {
		for i, a := range as {
			if specs[i].Reads(e.Kind) {
				a.Observe(e)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	prog.Done()
	out := make([]*Result, len(as))
	for i, a := range as {
		if out[i], err = a.Finish(); err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
	}
	return out, nil
}

// stepLeaks is the step and exit leak analysis (spec.StepLeaks).
type stepLeaks struct{ *LeakAnalyzer }

func (a *stepLeaks) Finish() (*Result, error) {
	r := a.LeakAnalyzer.Finish()
	return &Result{Value: r, Summary: r.Summary, File: "leaks_", WriteCSV: r.WriteCSV}, nil
}

// decompose is memory by owner (spec.Decompose).
type decompose struct{ *DecomposeAnalyzer }

func (a *decompose) Finish() (*Result, error) {
	r := a.DecomposeAnalyzer.Finish()
	return &Result{Value: r, Summary: func(int) string { return r.Summary() }, File: "decompose_", WriteCSV: r.WriteCSV}, nil
}

// markLeaks is the leak analysis between mstx marks (spec.MarkLeaks).
type markLeaks struct {
	*MarkLeakAnalyzer
	input string
}

func newMarkLeaks(args map[string]any, input string) (Analysis, error) {
	opt := MarkLeakOptions{MstxInfo: args["mstx_info"].(string), StartIndex: int(args["start_index"].(int64))}
	if v, ok := args["event_type"].(string); ok {
		if !slices.Contains(trace.MemoryTypes, v) {
			return nil, &ArgError{Kind: "ValueError", Msg: fmt.Sprintf("event_type %q is not an Event Type of MALLOC rows: give one of %s, or None for all", v, strings.Join(trace.MemoryTypes, ", "))}
		}
		opt.EventType = v
	}
	if strings.TrimSpace(opt.MstxInfo) == "" {
		return nil, &ArgError{Kind: "ValueError", Msg: "mstx_info must not be empty or blank"}
	}
	if opt.StartIndex < 0 {
		return nil, &ArgError{Kind: "ValueError", Msg: fmt.Sprintf("start_index must be a non-negative integer, got %d", opt.StartIndex)}
	}
	return &markLeaks{NewMarkLeakAnalyzer(opt), input}, nil
}

func markLeaksResult(r *MarkLeakReport) *Result {
	return &Result{Value: r, Summary: r.Summary}
}

func (a *markLeaks) Finish() (*Result, error) {
	r, err := a.MarkLeakAnalyzer.Finish()
	if err != nil {
		return nil, err
	}
	r.Input = a.input
	return markLeaksResult(r), nil
}

// runFile reads up to mark C, then the leaked blocks' stacks (CheckLeaks).
func (a *markLeaks) runFile(path string, prog *Progress) (*Result, error) {
	r, err := CheckLeaks(path, a.opt, prog)
	if err != nil {
		return nil, err
	}
	return markLeaksResult(r), nil
}

// inefficient is the inefficient-memory analysis (spec.Inefficient): it
// annotates the MALLOC rows of the blocks it finds.
type inefficient struct {
	*InefficientAnalyzer
	input string
	rep   *IneffReport
	next  int // the next of rep.marks to annotate
}

func newInefficient(args map[string]any, input string) (Analysis, error) {
	opt := IneffOptions{}
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
	return &inefficient{InefficientAnalyzer: NewInefficientAnalyzer(opt), input: input}, nil
}

func ineffResult(r *IneffReport) *Result {
	return &Result{Value: r, Summary: r.Summary}
}

func (a *inefficient) Finish() (*Result, error) {
	a.rep = a.InefficientAnalyzer.Finish()
	a.rep.Input = a.input
	return ineffResult(a.rep), nil
}

// Annotate adds the results found for e's block to its MALLOC row.
func (a *inefficient) Annotate(e *trace.Event) {
	m := a.rep.marks
	for a.next < len(m) && m[a.next].id < e.ID {
		a.next++
	}
	if a.next == len(m) || m[a.next].id != e.ID || e.Kind != trace.KindMalloc || !m[a.next].isNew {
		return
	}
	s, n := trace.MergeIneff(e.Inefficient, ineffTypeLists[m[a.next].flags])
	e.Inefficient = s
	a.rep.Added += n
	a.rep.Written = a.rep.Written || n > 0
}

// runFile adds the results to the file's MALLOC rows (CheckInefficient).
func (a *inefficient) runFile(path string, prog *Progress) (*Result, error) {
	r, err := CheckInefficient(path, a.opt, prog)
	if err != nil {
		return nil, err
	}
	return ineffResult(r), nil
}
