package export

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"msmemscope/analyzer"
	"msmemscope/internal/version"
)

// The page's script and style, inlined into every report: it opens from
// disk with no network.
var (
	//go:embed report/report.js
	reportJS string
	//go:embed report/report.css
	reportCSS string
)

// ProcReport is one process's part of an HTML report: aggregated, so that
// its size does not grow with the number of events.
type ProcReport struct {
	Pid      int64    `json:"pid"`
	Command  string   `json:"command"`
	Events   uint64   `json:"events"` // MALLOC and FREE events
	Mallocs  uint64   `json:"mallocs"`
	T0       uint64   `json:"t0"` // ns, the capture's clock
	T1       uint64   `json:"t1"`
	Types    []RType  `json:"types"`
	Owners   []ROwner `json:"owners"`
	Views    []RView  `json:"views"`
	Timeline struct {
		T []uint64  `json:"t"`
		V [][]int64 `json:"v"` // per point: each type's live bytes, then each owner's
	} `json:"timeline"`
	Steps       []htmlSpan                `json:"steps"`
	Ranges      []htmlSpan                `json:"ranges"`
	Marks       []htmlSpan                `json:"marks"`
	OOMs        []htmlOOM                 `json:"ooms"`
	Frames      []string                  `json:"frames"`
	Sites       []RSite                   `json:"sites"`
	Tops        map[string][]int          `json:"tops"` // bytes, count, temporary, peak: indexes into Sites
	Leaks       []RLeak                   `json:"leaks"`
	LeakScan    bool                      `json:"leak_scan"`       // the scan at exit judged the host heap's blocks
	Lost        int64                     `json:"definitely_lost"` // bytes, over every block (Leaks keeps the largest groups)
	StepLeaks   []RStepLeak               `json:"step_leaks"`
	Inefficient []IneffRow                `json:"inefficient"`
	Decompose   *analyzer.DecomposeReport `json:"decompose"`
	Moments     []htmlMoment              `json:"moments"`
}

// RType is an Event Type's live bytes at its view's peak and at the end.
type RType struct {
	Name string `json:"name"`
	View int    `json:"view"` // 0 memory, 1 framework blocks inside it
	Peak int64  `json:"peak"`
	End  int64  `json:"end"`
}

// ROwner is an owner's (PTA@model@weight...) live bytes.
type ROwner struct {
	Name string `json:"name"`
	Type string `json:"type"`
	View int    `json:"view"`
	Peak int64  `json:"peak"`
	End  int64  `json:"end"`
}

// RView is a view's peak.
type RView struct {
	Name  string `json:"name"`
	Peak  int64  `json:"peak"`
	PeakT uint64 `json:"peak_t"`
	End   int64  `json:"end"`
}

// RSite is a call stack of one Event Type (its frames root first, indexes
// into Frames) with its figures.
type RSite struct {
	Stack  []int32 `json:"stack"`
	Type   string  `json:"type"`
	View   int     `json:"view"`
	AllocN int64   `json:"alloc_n"`
	AllocB int64   `json:"alloc_b"`
	TempN  int64   `json:"temp_n"`
	PeakB  int64   `json:"peak_b"`
	LiveN  int64   `json:"live_n"`
	LiveB  int64   `json:"live_b"`
}

// RLeak is the blocks of one site alive at the end, of one leak kind.
type RLeak struct {
	Kind   string `json:"kind"` // LeakKinds, or "" when not judged
	Site   int    `json:"site"`
	Bytes  int64  `json:"bytes"`
	Blocks int64  `json:"blocks"`
	Step0  int32  `json:"step0"` // the steps its blocks were allocated in
	Step1  int32  `json:"step1"`
}

// RStepLeak is a block the step leak analysis found.
type RStepLeak struct {
	Step  int    `json:"step"`
	Type  string `json:"type"`
	Size  uint64 `json:"size"`
	Stack string `json:"stack"`
}

// Report aggregates what the writer saw into a ProcReport.
func (h *htmlWriter) Report() *ProcReport {
	if h.report != nil {
		return h.report
	}
	r := &ProcReport{Pid: h.pid, Command: strings.Join(h.command, " "), Events: h.events, Mallocs: h.mallocs,
		T0: h.firstNs, T1: h.lastNs, Steps: h.steps(), Ranges: h.ranges, Marks: h.marks, OOMs: h.ooms, Tops: map[string][]int{}}
	// Ranges left open end with the capture (in the order they began: the
	// same capture gives the same page).
	open := make([]htmlSpan, 0, len(h.openRanges))
	for _, o := range h.openRanges {
		open = append(open, o)
	}
	sort.Slice(open, func(i, j int) bool {
		return open[i].T0 < open[j].T0 || open[i].T0 == open[j].T0 && open[i].Name < open[j].Name
	})
	r.Ranges = append(r.Ranges, open[:min(len(open), max(0, maxSpans-len(r.Ranges)))]...)
	for i, t := range h.types.Names() {
		v := h.viewOf(uint16(i))
		r.Types = append(r.Types, RType{t, h.viewIndex(uint16(i)), v.types.peakOf(i), v.types.curOf(i)})
	}
	for i, typ := range h.ownerType {
		v := h.viewOf(typ)
		r.Owners = append(r.Owners, ROwner{h.owners.Name(int32(i)), h.types.Name(int32(typ)), h.viewIndex(typ), v.owners.peakOf(i), v.owners.curOf(i)})
	}
	for i, name := range []string{"memory", "framework blocks"} {
		v := &h.views[i]
		r.Views = append(r.Views, RView{name, v.peak, v.peakNs, v.total})
	}
	for _, p := range h.timeline.points {
		r.Timeline.T = append(r.Timeline.T, p.ns)
		r.Timeline.V = append(r.Timeline.V, p.layout(h.types.Len(), len(h.ownerType)))
	}

	// The sites the report names: the largest at each view's peak (the
	// flame graphs), the top of each table, those alive at the end and
	// those of the moments.
	keep := map[int32]int{}
	var order []int32
	add := func(i int32) {
		if _, ok := keep[i]; !ok {
			keep[i] = -1
			order = append(order, i)
		}
	}
	peakOf := func(i int) int64 { return h.viewOf(h.sites[i].typ).sites.peakOf(i) }
	top := func(n int, val func(i int) int64) []int32 {
		idx := make([]int32, 0, len(h.sites))
		for i := range h.sites {
			if val(i) > 0 {
				idx = append(idx, int32(i))
			}
		}
		sort.Slice(idx, func(a, b int) bool {
			va, vb := val(int(idx[a])), val(int(idx[b]))
			return va > vb || va == vb && idx[a] < idx[b]
		})
		return idx[:min(n, len(idx))]
	}
	for _, i := range top(maxFlameSites, peakOf) {
		add(i)
	}
	// The tables in a fixed order: the same capture gives the same page.
	tables := []struct {
		name string
		val  func(i int) int64
	}{
		{"bytes", func(i int) int64 { return h.sites[i].allocB }},
		{"count", func(i int) int64 { return h.sites[i].allocN }},
		{"temporary", func(i int) int64 { return h.sites[i].tempN }},
		{"peak", peakOf},
	}
	tableIdx := map[string][]int32{}
	for _, tb := range tables {
		tableIdx[tb.name] = top(maxTableSites, tb.val)
		for _, i := range tableIdx[tb.name] {
			add(i)
		}
	}
	leaks, lost := h.leaks()
	r.Lost = lost
	for _, l := range leaks {
		add(int32(l.Site))
	}
	for _, m := range h.moments.list {
		for _, i := range m.site {
			add(i)
		}
	}
	frameIDs := map[string]int32{}
	for _, i := range order {
		keep[i] = len(r.Sites)
		s := &h.sites[i]
		frames := strings.Split(s.stack, ";")
		st := make([]int32, len(frames))
		for j, f := range frames { // innermost first in the rows: root first here
			id, ok := frameIDs[f]
			if !ok {
				id = int32(len(r.Frames))
				frameIDs[f] = id
				r.Frames = append(r.Frames, f)
			}
			st[len(frames)-1-j] = id
		}
		r.Sites = append(r.Sites, RSite{Stack: st, Type: h.types.Name(int32(s.typ)), View: h.viewIndex(s.typ), AllocN: s.allocN,
			AllocB: s.allocB, TempN: s.tempN, PeakB: peakOf(int(i)), LiveN: s.liveN, LiveB: s.liveB})
	}
	for name, idx := range tableIdx {
		out := make([]int, len(idx))
		for j, i := range idx {
			out[j] = keep[i]
		}
		r.Tops[name] = out
	}
	for _, l := range leaks {
		l.Site = keep[int32(l.Site)]
		r.Leaks = append(r.Leaks, l)
	}
	r.LeakScan = h.kindOf != nil
	for _, m := range h.moments.list {
		m.Sites = make([][2]int64, len(m.site))
		for j, i := range m.site {
			m.Sites[j] = [2]int64{int64(keep[i]), m.bytes[j]}
		}
		r.Moments = append(r.Moments, m)
	}
	for _, x := range h.ineff {
		r.Inefficient = append(r.Inefficient, *x)
	}
	if a := h.reports; a != nil {
		r.Decompose = a.Decompose
		if a.Leaks != nil {
			for _, l := range a.Leaks.StepLeaks[:min(len(a.Leaks.StepLeaks), maxSpans)] {
				st := l.PyStack
				if st == "" {
					st = l.CStack
				}
				r.StepLeaks = append(r.StepLeaks, RStepLeak{l.Step, l.Type, l.Size, st})
			}
		}
		if a.Inefficient != nil && len(r.Inefficient) == 0 {
			for _, b := range a.Inefficient.Blocks {
				r.Inefficient = append(r.Inefficient, IneffRow{Type: b.EventType, Kinds: strings.Join(b.Types, "|"), Blocks: 1, Bytes: int64(b.Size),
					Stack: fmt.Sprintf("allocation_id %d (row %d)", b.AllocID, b.ID)})
			}
		}
	}
	sort.Slice(r.Inefficient, func(a, b int) bool {
		x, y := &r.Inefficient[a], &r.Inefficient[b]
		if x.Bytes != y.Bytes {
			return x.Bytes > y.Bytes
		}
		return x.Kinds+x.Stack < y.Kinds+y.Stack
	})
	r.Inefficient = r.Inefficient[:min(len(r.Inefficient), maxTableSites)]
	h.report = r
	return r
}

// steps are the step() calls' steps if the process made any, else the
// mstx "step start" ranges (SPEC §3).
func (h *htmlWriter) steps() []htmlSpan {
	if len(h.callEnds) == 0 {
		return h.rangeSteps
	}
	out := make([]htmlSpan, 0, len(h.callEnds))
	t0 := h.firstNs
	for _, t := range h.callEnds {
		out = append(out, htmlSpan{Name: "step", T0: t0, T1: t})
		t0 = t
	}
	return out
}

// leaks groups the blocks alive at the end by leak kind and site (the
// largest maxFlameSites groups), and totals the definitely lost bytes.
func (h *htmlWriter) leaks() ([]RLeak, int64) {
	type key struct {
		kind string
		site int32
	}
	by := map[key]*RLeak{}
	calls := len(h.callEnds) > 0
	for id, b := range h.live {
		kind := ""
		if h.kindOf != nil {
			kind, _ = h.kindOf(id)
		}
		k := key{kind, b.site}
		l := by[k]
		step := b.stepR
		if calls {
			step = b.stepC
		}
		if l == nil {
			l = &RLeak{Kind: kind, Site: int(b.site), Step0: step, Step1: step}
			by[k] = l
		}
		l.Bytes += b.size
		l.Blocks++
		l.Step0, l.Step1 = min(l.Step0, step), max(l.Step1, step)
	}
	out := make([]RLeak, 0, len(by))
	lost := int64(0)
	for _, l := range by {
		out = append(out, *l)
		if l.Kind == analyzer.LeakKinds[0] {
			lost += l.Bytes
		}
	}
	rank := func(k string) int {
		for i, v := range analyzer.LeakKinds {
			if v == k {
				return i
			}
		}
		return len(analyzer.LeakKinds)
	}
	sort.Slice(out, func(a, b int) bool {
		if ra, rb := rank(out[a].Kind), rank(out[b].Kind); ra != rb {
			return ra < rb
		}
		if out[a].Bytes != out[b].Bytes {
			return out[a].Bytes > out[b].Bytes
		}
		return out[a].Site < out[b].Site
	})
	return out[:min(len(out), maxFlameSites)], lost
}

// reportData is the page's data: every process of a run, and a compare.
type reportData struct {
	Title     string                  `json:"title"`
	Version   string                  `json:"version"`
	Generated string                  `json:"generated"`
	Processes []*ProcReport           `json:"processes"`
	LeakKinds []string                `json:"leak_kinds"`
	Compare   *analyzer.CompareReport `json:"compare"`
}

// writeHTML writes the page: style, data and script inlined.
func writeHTML(w io.Writer, procs []*ProcReport, cmp *analyzer.CompareReport) error {
	d := reportData{Title: "msmemscope report", Version: version.Version, Generated: time.Now().Format(time.RFC3339),
		Processes: procs, LeakKinds: analyzer.LeakKinds, Compare: cmp}
	if len(procs) == 1 && procs[0].Command != "" {
		d.Title = "msmemscope: " + procs[0].Command
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	fmt.Fprintf(bw, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>%s</title>\n<style>\n%s</style>\n</head>\n<body>\n",
		htmlEscape(d.Title), reportCSS)
	bw.WriteString(`<noscript>This report draws its charts with JavaScript: allow scripts for this file.</noscript>` + "\n")
	bw.WriteString(`<div id="app"></div>` + "\n" + `<script type="application/json" id="msmemscope-data">`)
	enc := json.NewEncoder(bw) // escapes <, > and &: the data cannot end the script
	if err := enc.Encode(d); err != nil {
		return err
	}
	bw.WriteString("</script>\n<script>\n")
	bw.WriteString(reportJS)
	bw.WriteString("</script>\n</body></html>\n")
	return bw.Flush()
}

func htmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// RunReport writes one HTML report over several processes' reports (a run's
// traced processes) and, when cmp is not nil, a compare, into dir as
// report_{stamp}.html; it returns the path.
func RunReport(dir, stamp string, procs []*ProcReport, cmp *analyzer.CompareReport) (string, error) {
	return writeFile(dir, "report_"+stamp, ".html", func(w io.Writer) error { return writeHTML(w, procs, cmp) })
}

// Reports returns the HTML reports of the set's exporters (the run's report
// gathers them).
func (s *Set) Reports() []*ProcReport {
	if s == nil {
		return nil
	}
	var out []*ProcReport
	for _, w := range s.ws {
		if h, ok := w.(*htmlWriter); ok {
			out = append(out, h.Report())
		}
	}
	return out
}
