package analyzer

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"msmemscope/trace"

	"msmemscope/internal/safefs"
)

// Mark leaks (SPEC §5.1, offline check_leaks): the marks whose message is
// MstxInfo are numbered from 0 in file order; mark StartIndex is A and the
// next two are B and C. A block allocated between A and B (a MALLOC row
// after A and before B) whose FREE does not come before C is a leak.

// MarkLeakOptions are check_leaks' parameters.
type MarkLeakOptions struct {
	MstxInfo   string // the mark message
	StartIndex int    // the index of mark A among the marks with that message
	EventType  string // only MALLOCs of this Event Type ("HAL", "PTA", ...); "" = all
}

// MarkRef is one of the three marks.
type MarkRef struct {
	ID        uint64 `json:"id"`
	Timestamp uint64 `json:"timestamp"`
}

// MarkLeak is a leaked block.
type MarkLeak struct {
	ID        uint64 `json:"id"` // the MALLOC row's ID
	AllocID   uint64 `json:"allocation_id"`
	Ptr       string `json:"ptr"`
	Size      uint64 `json:"size"`
	EventType string `json:"event_type"`
	Device    string `json:"device"`
	Pid       int64  `json:"pid"`
	Tid       int64  `json:"tid"`
	Timestamp uint64 `json:"timestamp"`
	Owner     string `json:"owner"`
	PyStack   string `json:"python_stack"`
	CStack    string `json:"c_stack"`
}

// MarkLeakReport is check_leaks' result.
type MarkLeakReport struct {
	Input      string     `json:"input_path"`
	MstxInfo   string     `json:"mstx_info"`
	StartIndex int        `json:"start_index"`
	EventType  string     `json:"event_type"`
	A          MarkRef    `json:"mark_a"`
	B          MarkRef    `json:"mark_b"`
	C          MarkRef    `json:"mark_c"`
	Leaks      []MarkLeak `json:"leaks"` // by MALLOC row ID
	Bytes      uint64     `json:"leaked_bytes"`
	Rows       uint64     `json:"rows_analysed"` // rows of the kinds the analysis reads
}

type blockKey struct {
	pid int64
	id  uint64
}

// MarkLeakAnalyzer finds mark leaks in a stream of events. Memory grows with
// the blocks allocated between A and B that are still alive, nothing else.
type MarkLeakAnalyzer struct {
	opt    MarkLeakOptions
	seen   int // marks with the message so far
	ranges int // ranges opened with the message (not marks: said when marks are missing)
	phase  int // 0: before A, 1: A..B, 2: B..C, 3: after C
	live   map[blockKey]*MarkLeak
	rep    MarkLeakReport
}

// NewMarkLeakAnalyzer returns an analyzer for opt.
func NewMarkLeakAnalyzer(opt MarkLeakOptions) *MarkLeakAnalyzer {
	a := &MarkLeakAnalyzer{opt: opt, live: map[blockKey]*MarkLeak{}}
	a.rep = MarkLeakReport{MstxInfo: opt.MstxInfo, StartIndex: opt.StartIndex, EventType: opt.EventType}
	return a
}

// Done reports whether mark C has been seen: later events change nothing.
func (a *MarkLeakAnalyzer) Done() bool { return a.phase == 3 }

// Observe feeds the next event.
func (a *MarkLeakAnalyzer) Observe(e *trace.Event) {
	a.rep.Rows++
	switch e.Kind {
	case trace.KindMstx:
		if e.Type == trace.TypeRangeStart && e.Name == a.opt.MstxInfo {
			a.ranges++
		}
		if e.Type != trace.TypeMark || e.Name != a.opt.MstxInfo || a.phase == 3 {
			return
		}
		ref := MarkRef{ID: e.ID, Timestamp: e.Timestamp}
		switch a.seen - a.opt.StartIndex {
		case 0:
			a.rep.A, a.phase = ref, 1
		case 1:
			a.rep.B, a.phase = ref, 2
		case 2:
			a.rep.C, a.phase = ref, 3
		}
		a.seen++
	case trace.KindMalloc:
		if a.phase != 1 || (a.opt.EventType != "" && e.Type != a.opt.EventType) {
			return
		}
		a.live[blockKey{e.Pid, e.AllocID}] = &MarkLeak{
			ID: e.ID, AllocID: e.AllocID, Ptr: fmt.Sprintf("0x%x", e.Ptr), Size: e.Size, EventType: e.Type,
			Device: e.Device, Pid: e.Pid, Tid: e.Tid, Timestamp: e.Timestamp, Owner: e.Owner,
			PyStack: e.PyStack, CStack: e.CStack,
		}
	case trace.KindFree:
		if a.phase == 1 || a.phase == 2 {
			delete(a.live, blockKey{e.Pid, e.AllocID})
		}
	}
}

// Finish returns the report, or an error when the three marks were not all
// found.
func (a *MarkLeakAnalyzer) Finish() (*MarkLeakReport, error) {
	if a.phase != 3 {
		hint := ""
		if a.ranges > 0 {
			hint = fmt.Sprintf("; %d range%s opened with that message, but only marks (mstx.mark, mstxMarkA) count", a.ranges, leakPlural(a.ranges))
		}
		return nil, fmt.Errorf("found %d MSTX mark%s with message %q: start_index %d needs %d (marks A, B and C)%s",
			a.seen, leakPlural(a.seen), a.opt.MstxInfo, a.opt.StartIndex, a.opt.StartIndex+3, hint)
	}
	r := a.rep
	r.Leaks = make([]MarkLeak, 0, len(a.live))
	for _, l := range a.live {
		r.Leaks = append(r.Leaks, *l)
		r.Bytes += l.Size
	}
	slices.SortFunc(r.Leaks, func(x, y MarkLeak) int { return cmp.Compare(x.ID, y.ID) })
	return &r, nil
}

// CheckLeaks runs the mark-leak analysis over a dump file: it judges up to
// mark C and checks the rest, then reads the leaked blocks' complete rows
// (call stacks).
func CheckLeaks(path string, opt MarkLeakOptions, prog *Progress) (*MarkLeakReport, error) {
	if opt.MstxInfo == "" {
		return nil, fmt.Errorf("mstx_info must not be empty")
	}
	if opt.StartIndex < 0 {
		return nil, fmt.Errorf("start_index must be >= 0, got %d", opt.StartIndex)
	}
	in, err := trace.Open(path, trace.OpenOptions{Lean: true, Reuse: true,
		Kinds: []trace.Kind{trace.KindMstx, trace.KindMalloc, trace.KindFree}})
	if err != nil {
		return nil, err
	}
	defer in.Close()
	defer prog.Done()
	prog.Track(in)
	a := NewMarkLeakAnalyzer(opt)
	// The rows after mark C are read too, unobserved: a file cut short or
	// damaged anywhere is an error, not a report (README: inputs are
	// checked whole).
	err = trace.Each(in, func(e *trace.Event) error {
		if !a.Done() {
			a.Observe(e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r, err := a.Finish()
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	r.Input = path
	if len(r.Leaks) > 0 {
		ids := make([]uint64, len(r.Leaks))
		for i := range r.Leaks {
			ids[i] = r.Leaks[i].ID
		}
		i := 0
		err := in.Lookup(ids, func(e *trace.Event) error {
			for i < len(r.Leaks) && r.Leaks[i].ID < e.ID {
				i++
			}
			if i < len(r.Leaks) && r.Leaks[i].ID == e.ID {
				r.Leaks[i].PyStack, r.Leaks[i].CStack = e.PyStack, e.CStack
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// Summary is the console report of check_leaks.
func (r *MarkLeakReport) Summary(top int) string {
	var b strings.Builder
	scope := "every MALLOC type"
	if r.EventType != "" {
		scope = r.EventType + " blocks"
	}
	fmt.Fprintf(&b, "check_leaks %s: marks %q #%d..#%d (IDs %d, %d, %d), %s\n", r.Input, r.MstxInfo,
		r.StartIndex, r.StartIndex+2, r.A.ID, r.B.ID, r.C.ID, scope)
	if len(r.Leaks) == 0 {
		b.WriteString("  no leaks: every block allocated between marks A and B was freed before mark C\n")
		return b.String()
	}
	fmt.Fprintf(&b, "  %d block%s (%s) allocated between A and B are not freed before C:\n",
		len(r.Leaks), leakPlural(len(r.Leaks)), safefs.HumanBytes(r.Bytes))
	for i := range r.Leaks[:min(top, len(r.Leaks))] {
		l := &r.Leaks[i]
		site := ""
		switch {
		case l.CStack != "":
			site = "  " + leakCallSite(l.CStack, 3)
		case l.PyStack != "":
			site = "  " + leakCallSite(l.PyStack, 3)
		}
		fmt.Fprintf(&b, "    ID %d: %s %s at %s (allocation_id %d, device %s, owner %s)%s\n", l.ID, safefs.HumanBytes(l.Size),
			l.EventType, l.Ptr, l.AllocID, leakNA(l.Device), leakNA(l.Owner), site)
	}
	if len(r.Leaks) > top {
		fmt.Fprintf(&b, "    ... and %d more\n", len(r.Leaks)-top)
	}
	return b.String()
}
