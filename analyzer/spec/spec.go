// Package spec is the table of analyses: for each, its names, its
// parameters with their defaults, and the rows it reads. It is a leaf (it
// imports only the event model), so that config can check --analysis
// against it and switch on the events an analysis needs, while the
// analyses themselves (package analyzer, which attaches the code to each
// entry) are free to import whatever reads inputs.
package spec

import (
	"slices"

	"msmemscope/trace"
)

// Internal names: one per analysis, never shown to users. The two leak
// analyses share the name users see ("leaks") in different places.
const (
	StepLeaks   = "StepLeaks"   // step and exit leaks (SPEC §5.1): --analysis=leaks
	MarkLeaks   = "MarkLeaks"   // leaks between mstx marks A, B, C: check_leaks, analyze("leaks")
	Inefficient = "Inefficient" // SPEC §5.3: --analysis=inefficient, check_inefficient
	Decompose   = "Decompose"   // memory by owner (SPEC §5.5): --analysis=decompose
)

// InputParam is the parameter naming the file an offline call reads.
const InputParam = "input_path"

// DefaultIdleThreshold is idle_threshold's default.
const DefaultIdleThreshold = 3000

// Param describes one parameter of an analysis.
type Param struct {
	Name        string `json:"-"`
	Type        string `json:"type"` // Python's spelling: "str", "int", "Optional[str]", "Optional[List[str]]"
	Required    bool   `json:"required"`
	Default     any    `json:"default"`
	Description string `json:"description"`
}

// Analysis describes one analysis.
type Analysis struct {
	Name    string // internal name
	Option  string // its --analysis value; "": the CLI does not offer it
	Offline string // its name for analyze() and list_analyzers(); "": Python does not offer it
	Label   string // what progress shows while the offline call runs
	Params  []Param
	// Needs are the kinds of rows it reads: a capture records their events
	// (config), and it is fed only rows of these kinds.
	Needs []trace.Kind
	// Steps: it reads step numbers, and sees every row (a step ends at the
	// first row after it, whatever its kind).
	Steps bool
	// Annotates: it writes its results into rows (the MALLOC rows'
	// inefficient attr), so it must have decided about a row before the row
	// is written.
	Annotates bool
	// Top is how many findings its console report lists.
	Top int
}

// All lists the analyses; --analysis values and list_analyzers() come in
// this order.
var All = []Analysis{
	{Name: StepLeaks, Option: "leaks", Needs: []trace.Kind{trace.KindMalloc, trace.KindFree}, Steps: true, Top: 5},
	{Name: MarkLeaks, Offline: "leaks", Label: "check_leaks", Top: 20,
		Needs: []trace.Kind{trace.KindMstx, trace.KindMalloc, trace.KindFree},
		Params: []Param{
			{Name: InputParam, Type: "str", Required: true, Description: "a memscope_dump CSV or DB file written by msmemscope"},
			{Name: "mstx_info", Type: "str", Required: true, Description: "the message of the mstx marks that delimit the range (mstxMarkA / msmemscope.mstx.mark)"},
			{Name: "start_index", Type: "int", Required: true, Description: "which mark (from 0, among those with that message) is A; the next two are B and C. Blocks allocated between A and B and not freed before C are leaks"},
			{Name: "event_type", Type: "Optional[str]", Default: nil, Description: "only MALLOCs of this Event Type (HOST, MMAP, PTA, HAL, ...); None: every type"},
		}},
	{Name: Inefficient, Option: "inefficient", Offline: "inefficient", Label: "check_inefficient", Annotates: true, Top: 10,
		Needs: []trace.Kind{trace.KindOpLaunch, trace.KindMalloc, trace.KindFree, trace.KindAccess},
		Params: []Param{
			{Name: InputParam, Type: "str", Required: true, Description: "a memscope_dump CSV or DB file written by msmemscope; results are added to its MALLOC rows"},
			{Name: "mem_size", Type: "int", Default: 0, Description: "size floor in bytes: smaller blocks are not judged"},
			{Name: "inefficient_type", Type: "Optional[List[str]]", Default: nil, Description: "types to look for: early_allocation, late_deallocation, temporary_idleness; None: all three"},
			{Name: "idle_threshold", Type: "int", Default: DefaultIdleThreshold, Description: "temporary_idleness: more than this many apis between two accesses of a block"},
		}},
	{Name: Decompose, Option: "decompose", Needs: []trace.Kind{trace.KindMalloc, trace.KindFree, trace.KindSnapshot, trace.KindMap, trace.KindUnmap}},
}

func find(match func(*Analysis) bool) *Analysis {
	if i := slices.IndexFunc(All, func(a Analysis) bool { return match(&a) }); i >= 0 {
		return &All[i]
	}
	return nil
}

// ByName returns the analysis of an internal name, nil if none.
func ByName(name string) *Analysis {
	return find(func(a *Analysis) bool { return a.Name == name })
}

// ByOption returns the analysis an --analysis value means, nil if none.
func ByOption(option string) *Analysis {
	return find(func(a *Analysis) bool { return option != "" && a.Option == option })
}

// ByOffline returns the analysis an analyze() name means, nil if none.
func ByOffline(name string) *Analysis {
	return find(func(a *Analysis) bool { return name != "" && a.Offline == name })
}

// Options lists the --analysis values in order.
func Options() []string { return names(func(a *Analysis) string { return a.Option }) }

// OfflineNames lists the analyze() names in order: list_analyzers().
func OfflineNames() []string { return names(func(a *Analysis) string { return a.Offline }) }

// names lists name(a) of the analyses that have one, in order.
func names(name func(*Analysis) string) []string {
	var out []string
	for i := range All {
		if n := name(&All[i]); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// Reads reports whether the analysis is fed a row of kind k.
func (a *Analysis) Reads(k trace.Kind) bool {
	return a.Steps || slices.Contains(a.Needs, k)
}
