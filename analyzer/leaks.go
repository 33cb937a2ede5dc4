// Package analyzer holds msmemscope's analyses (SPEC §5): pure Go over streams
// of trace.Event, the same code online and offline.
package analyzer

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"msmemscope/internal/safefs"
	"msmemscope/trace"
)

// Leak is one leaked block.
type Leak struct {
	AllocID   uint64
	Ptr       uint64
	Size      uint64
	Step      int    // the step the block was allocated in
	Type      string // the MALLOC's Event Type (HOST, MMAP, PTA, ...)
	Device    string // "" is N/A
	Owner     string
	PyStack   string
	CStack    string
	MallocID  uint64 // the MALLOC row's ID
	Timestamp uint64 // the MALLOC's timestamp
	Kind      string // an exit leak's kind (LeakKinds), "" when no scan ran
}

// LeakKinds are the kinds of exit leaks, valgrind's, in its order: the
// scan at exit sorts the blocks alive then by the pointers to them
// (package leakscan).
var LeakKinds = []string{"definitely_lost", "indirectly_lost", "possibly_lost", "still_reachable"}

// kindRank orders kinds as LeakKinds, unknown last.
func kindRank(k string) int {
	for i, v := range LeakKinds {
		if v == k {
			return i
		}
	}
	return len(LeakKinds)
}

// Stack is the call stack a leak is grouped by: the C stack, else the Python
// stack, else LeakNoStack.
func (l *Leak) Stack() string {
	switch {
	case l.CStack != "":
		return l.CStack
	case l.PyStack != "":
		return l.PyStack
	}
	return LeakNoStack
}

// LeakNoStack is the group key of blocks recorded without a call stack.
const LeakNoStack = "(no stack)"

// LeakGroup is the exit leaks of one kind and call stack.
type LeakGroup struct {
	Kind   string // "" when unknown
	Type   string // the blocks' Event Type when they have no kind (MMAP, HAL...: the scan reads the host heap's only)
	Stack  string // see Leak.Stack
	Count  int
	Bytes  uint64
	Blocks []Leak // by MALLOC row ID
}

// LeakReport is the result of the leaks analysis (SPEC §5.1).
type LeakReport struct {
	StepLeaks  []Leak      // by step, then MALLOC row ID
	ExitLeaks  []LeakGroup // by kind (LeakKinds' order), then largest first
	ExitBlocks int
	ExitBytes  uint64
	// ByKind totals the exit leaks of each kind; nil when no scan ran (a
	// killed run, a CSV or DB input).
	ByKind map[string]KindTotal
	Steps  int // the highest step seen
	// ExitUnknown says why blocks alive at the end are not reported (the
	// host heap stopped being recorded before the end): no exit leaks.
	ExitUnknown string `json:",omitempty"`
	// EndName says where the blocks alive at the end were, in the console
	// summary: "at exit" when empty (a rotated log read alone: its end).
	EndName string `json:"-"`
}

// KindTotal is the exit leaks of one kind.
type KindTotal struct {
	Blocks int
	Bytes  uint64
}

// LeakAnalyzer finds step leaks and exit leaks in one process's events.
//
// It is fed every event in order; the events must already have ID, Step and
// AllocID set (a StepTracker numbers steps). Only MALLOC and FREE events
// matter: they are paired by AllocID, a FREE without a live MALLOC is ignored,
// and a shadow MALLOC is an ordinary block. Memory grows with the live blocks
// only.
//
// A step leak is a block allocated in a step s ≥ 2 that is still alive when
// step s+1 ends, one full step later; each is reported once. Step k ends when
// the steps move past it: at the first event after it whose Step differs (the
// event after the STEP event that ends k, or after the Range_end that closes
// range k), or at the end of the stream if the last event is that STEP event
// or Range_end. A block still alive when the stream ends is an exit leak;
// exit leaks are grouped by call stack (Leak.Stack), the group with the most
// bytes first (ties: more blocks, then the stack string).
type LeakAnalyzer struct {
	live    leakLive                    // the live blocks, by AllocID
	pending map[int]map[uint64]struct{} // step s ≥ 2 → its live blocks not yet judged
	found   []Leak

	last      int  // the Step of the previous event
	lastEnds  bool // the previous event explicitly ended step last
	rangeID   uint64
	haveRange bool // rangeID is the MstxID of the "step start" range that opened step last
	maxStep   int
	maxID     uint64 // the highest AllocID of a MALLOC so far
	done      *LeakReport
	kindOf    func(allocID uint64) (string, bool)
	noExit    string // SetExitUnknown's reason
}

// SetExitUnknown says that the blocks alive at the end are not known to be
// alive (their frees stopped being recorded): Finish reports no exit leaks,
// and the report says why.
func (a *LeakAnalyzer) SetExitUnknown(reason string) { a.noExit = reason }

// SetKinds gives the kinds the scan at exit found (kind of an allocation id,
// and whether a scan ran at all): exit leaks are grouped by kind too.
func (a *LeakAnalyzer) SetKinds(kindOf func(allocID uint64) (string, bool)) { a.kindOf = kindOf }

// NewLeakAnalyzer returns an analyzer with no events seen.
func NewLeakAnalyzer() *LeakAnalyzer {
	return &LeakAnalyzer{pending: make(map[int]map[uint64]struct{})}
}

// Observe feeds the next event.
func (a *LeakAnalyzer) Observe(e *trace.Event) {
	if e.Step != a.last {
		if a.last > 0 {
			a.endStep(a.last)
		}
		a.last = e.Step
		a.haveRange = false
		if e.Kind == trace.KindMstx && e.Type == trace.TypeRangeStart && e.Name == trace.StepRangeMessage {
			a.rangeID, a.haveRange = e.MstxID, true
		}
	}
	a.maxStep = max(a.maxStep, e.Step)
	a.lastEnds = e.Step > 0 && (trace.IsStepCall(e) ||
		(a.haveRange && e.Kind == trace.KindMstx && e.Type == trace.TypeRangeEnd && e.MstxID == a.rangeID))

	switch e.Kind {
	case trace.KindMalloc:
		if e.AllocID <= a.maxID {
			a.free(e.AllocID) // a second MALLOC of a live id replaces the block
		}
		a.maxID = max(a.maxID, e.AllocID) // (every live id is ≤ maxID: a new one needs no look)
		moved := a.live.add(Leak{
			AllocID: e.AllocID, Ptr: e.Ptr, Size: e.Size, Step: e.Step, Type: e.Type,
			Device: e.Device, Owner: e.Owner, PyStack: e.PyStack, CStack: e.CStack,
			MallocID: e.ID, Timestamp: e.Timestamp,
		})
		// A block of step ≥ 2 waits to be judged: in the live blocks'
		// recent slots (endStep looks there), then in pending.
		if moved != nil && moved.step >= 2 {
			p := a.pending[int(moved.step)]
			if p == nil {
				p = make(map[uint64]struct{})
				a.pending[int(moved.step)] = p
			}
			p[moved.allocID] = struct{}{}
		}
	case trace.KindFree:
		a.free(e.AllocID)
	}
}

func (a *LeakAnalyzer) free(id uint64) {
	step, ok := a.live.take(id)
	if !ok {
		return
	}
	if p := a.pending[step]; p != nil {
		delete(p, id)
	}
}

// endStep judges the blocks of every step s ≤ k-1 still pending: step s+1 ≤ k
// is over and they are alive.
func (a *LeakAnalyzer) endStep(k int) {
	var found []Leak
	for s, ids := range a.pending {
		if s <= k-1 {
			for id := range ids {
				l, _ := a.live.get(id)
				found = append(found, l)
			}
			delete(a.pending, s)
		}
	}
	if a.live.waiting > 0 {
		a.live.eachRecent(func(b *leakBlock) {
			if s := int(b.step); s >= 2 && s <= k-1 && !b.judged {
				a.live.unwait(b)
				b.judged = true
				found = append(found, a.live.leak(b))
			}
		})
	}
	// By step, then in allocation order.
	slices.SortFunc(found, func(x, y Leak) int {
		if c := cmp.Compare(x.Step, y.Step); c != 0 {
			return c
		}
		return cmp.Compare(x.MallocID, y.MallocID)
	})
	a.found = append(a.found, found...)
}

// Finish ends the stream and returns the report. Later calls return the same
// report; Observe must not be called after Finish.
func (a *LeakAnalyzer) Finish() *LeakReport {
	if a.done != nil {
		return a.done
	}
	if a.lastEnds {
		a.endStep(a.last)
	}
	r := &LeakReport{StepLeaks: a.found, Steps: a.maxStep}
	if a.noExit != "" {
		r.ExitUnknown = a.noExit
		a.live, a.pending = leakLive{}, nil
		a.done = r
		return r
	}
	type groupKey struct{ kind, typ, stack string }
	groups := make(map[groupKey]*LeakGroup)
	if a.kindOf != nil {
		if _, ran := a.kindOf(0); ran {
			r.ByKind = map[string]KindTotal{}
		}
	}
	a.live.each(func(l Leak) {
		if r.ByKind != nil {
			l.Kind, _ = a.kindOf(l.AllocID)
			t := r.ByKind[l.Kind]
			t.Blocks++
			t.Bytes += l.Size
			r.ByKind[l.Kind] = t
		}
		key := groupKey{l.Kind, "", l.Stack()}
		if l.Kind == "" && r.ByKind != nil {
			key.typ = l.Type // not the host heap's: apart, named by their type
		}
		g := groups[key]
		if g == nil {
			g = &LeakGroup{Kind: l.Kind, Type: key.typ, Stack: key.stack}
			groups[key] = g
		}
		g.Count++
		g.Bytes += l.Size
		g.Blocks = append(g.Blocks, l)
		r.ExitBlocks++
		r.ExitBytes += l.Size
	})
	for _, g := range groups {
		slices.SortFunc(g.Blocks, func(x, y Leak) int { return cmp.Compare(x.MallocID, y.MallocID) })
		r.ExitLeaks = append(r.ExitLeaks, *g)
	}
	sortLeakGroups(r.ExitLeaks)
	a.live, a.pending = leakLive{}, nil
	a.done = r
	return r
}

// sortLeakGroups orders groups by kind (LeakKinds' order), then bytes, then
// blocks, descending, then by stack.
func sortLeakGroups(gs []LeakGroup) {
	slices.SortFunc(gs, func(x, y LeakGroup) int {
		if c := cmp.Compare(kindRank(x.Kind), kindRank(y.Kind)); c != 0 {
			return c
		}
		if c := cmp.Compare(y.Bytes, x.Bytes); c != 0 {
			return c
		}
		if x.Count != y.Count {
			return y.Count - x.Count
		}
		return strings.Compare(x.Stack, y.Stack)
	})
}

// LeakCSVHeader is the header of the leaks report written by WriteCSV.
var LeakCSVHeader = []string{"Leak", "Kind", "Step", "Allocation Id", "ID", "Timestamp(ns)", "Event Type", "Device Id", "Ptr", "Size(byte)", "Blocks", "Owner", "Call Stack(Python)", "Call Stack(C)"}

// WriteCSV writes the report as CSV (RFC 4180, header LeakCSVHeader): first
// one row per step leak, in StepLeaks order, then one row per exit-leak group,
// largest first.
//
//   - Leak: STEP or EXIT.
//   - Kind: an EXIT group's leak kind (LeakKinds); N/A for STEP rows and
//     where no scan ran at exit.
//   - Step: the step the block was allocated in (STEP rows; N/A for EXIT).
//   - Allocation Id: the block's allocation_id (STEP rows; N/A for EXIT).
//   - ID, Timestamp(ns), Ptr: the MALLOC row of the block; for an EXIT group,
//     of its earliest block, to find the group in the dump.
//   - Event Type, Device Id, Owner: the block's; for a group, the distinct
//     values of its blocks joined by '|' in order of first appearance. N/A
//     where empty.
//   - Size(byte): the block's size; for a group, the bytes of all its blocks.
//   - Blocks: 1, or the number of blocks in the group.
//   - Call Stack(Python), Call Stack(C): the block's stacks. For a group, the
//     stack it is grouped by is in its column (the C stack, else the Python
//     stack; both N/A for the no-stack group) and the other column holds the
//     earliest block's.
func (r *LeakReport) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(LeakCSVHeader); err != nil {
		return err
	}
	rec := make([]string, len(LeakCSVHeader))
	for i := range r.StepLeaks {
		l := &r.StepLeaks[i]
		rec = append(rec[:0], "STEP", trace.NA, strconv.Itoa(l.Step), leakU64(l.AllocID), leakU64(l.MallocID),
			leakU64(l.Timestamp), leakNA(l.Type), leakNA(l.Device), leakPtr(l.Ptr), leakU64(l.Size), "1",
			leakNA(l.Owner), leakNA(l.PyStack), leakNA(l.CStack))
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	for i := range r.ExitLeaks {
		g := &r.ExitLeaks[i]
		var first Leak
		if len(g.Blocks) > 0 {
			first = g.Blocks[0]
		}
		rec = append(rec[:0], "EXIT", leakNA(g.Kind), trace.NA, trace.NA, leakU64(first.MallocID), leakU64(first.Timestamp),
			leakNA(leakDistinct(g.Blocks, func(l *Leak) string { return l.Type })),
			leakNA(leakDistinct(g.Blocks, func(l *Leak) string { return l.Device })),
			leakPtr(first.Ptr), leakU64(g.Bytes), strconv.Itoa(g.Count),
			leakNA(leakDistinct(g.Blocks, func(l *Leak) string { return l.Owner })),
			leakNA(first.PyStack), leakNA(first.CStack)) // every block shares the grouping stack
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func leakU64(v uint64) string { return strconv.FormatUint(v, 10) }
func leakPtr(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }

func leakNA(s string) string {
	if s == "" {
		return trace.NA
	}
	return s
}

// leakDistinct joins the distinct non-empty values of f over blocks with '|'.
func leakDistinct(blocks []Leak, f func(*Leak) string) string {
	var vals []string
	for i := range blocks {
		v := f(&blocks[i])
		if v != "" && !slices.Contains(vals, v) {
			vals = append(vals, v)
			if len(vals) > 16 {
				break
			}
		}
	}
	return strings.Join(vals, "|")
}

// Summary returns a short console summary: the step leaks and exit leaks with
// their bytes, then the top largest leaking call sites of each (exit-leak
// groups; step leaks grouped the same way), largest first. A call site shows
// its stack innermost frame first.
func (r *LeakReport) Summary(top int) string {
	var b strings.Builder
	var stepBytes uint64
	for i := range r.StepLeaks {
		stepBytes += r.StepLeaks[i].Size
	}
	if r.ExitUnknown != "" {
		fmt.Fprintf(&b, "leaks: %d step leak%s (%s) over %d step%s; exit leaks not known: %s\n",
			len(r.StepLeaks), leakPlural(len(r.StepLeaks)), safefs.HumanBytes(stepBytes), r.Steps, leakPlural(r.Steps), r.ExitUnknown)
	} else {
		end := r.EndName
		if end == "" {
			end = "at exit"
		}
		fmt.Fprintf(&b, "leaks: %d step leak%s (%s) over %d step%s; %d block%s (%s) alive %s from %d call site%s\n",
			len(r.StepLeaks), leakPlural(len(r.StepLeaks)), safefs.HumanBytes(stepBytes), r.Steps, leakPlural(r.Steps),
			r.ExitBlocks, leakPlural(r.ExitBlocks), safefs.HumanBytes(r.ExitBytes), end, len(r.ExitLeaks), leakPlural(len(r.ExitLeaks)))
	}
	if r.ByKind != nil {
		b.WriteString("leak summary:")
		for i, k := range LeakKinds {
			t := r.ByKind[k]
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(&b, "%s %s: %s in %d block%s", sep, strings.ReplaceAll(k, "_", " "), safefs.HumanBytes(t.Bytes), t.Blocks, leakPlural(t.Blocks))
		}
		b.WriteString("\n")
	}
	if top <= 0 {
		return b.String()
	}
	if len(r.ExitLeaks) > 0 {
		if r.EndName != "" {
			fmt.Fprintf(&b, "largest blocks alive %s:\n", r.EndName)
		} else {
			b.WriteString("largest exit leaks:\n")
		}
		leakWriteSites(&b, r.ExitLeaks, top)
	}
	if len(r.StepLeaks) > 0 {
		b.WriteString("largest step leaks:\n")
		leakWriteSites(&b, leakGroupBy(r.StepLeaks), top)
	}
	return b.String()
}

func leakWriteSites(b *strings.Builder, gs []LeakGroup, top int) {
	for i := range gs[:min(top, len(gs))] {
		g := &gs[i]
		kind := ""
		switch {
		case g.Kind != "":
			kind = strings.ReplaceAll(g.Kind, "_", " ") + ": "
		case g.Type != "":
			kind = g.Type + " (no leak kind): "
		}
		fmt.Fprintf(b, "  %10s in %d block%s  %s%s\n", safefs.HumanBytes(g.Bytes), g.Count, leakPlural(g.Count), kind, leakCallSite(g.Stack, 3))
	}
	if len(gs) > top {
		fmt.Fprintf(b, "  ... and %d more call site%s\n", len(gs)-top, leakPlural(len(gs)-top))
	}
}

// leakGroupBy groups leaks by call stack like the exit leaks, largest first.
func leakGroupBy(ls []Leak) []LeakGroup {
	idx := make(map[string]int)
	var gs []LeakGroup
	for _, l := range ls {
		key := l.Stack()
		i, ok := idx[key]
		if !ok {
			i = len(gs)
			idx[key] = i
			gs = append(gs, LeakGroup{Stack: key})
		}
		gs[i].Count++
		gs[i].Bytes += l.Size
		gs[i].Blocks = append(gs[i].Blocks, l)
	}
	sortLeakGroups(gs)
	return gs
}

// leakCallSite formats a ';'-separated stack (innermost frame first) for a
// console line: its first frames frames joined by " < ", then how many more.
func leakCallSite(stack string, frames int) string {
	parts := strings.Split(stack, ";")
	n := len(parts)
	if n > frames {
		parts = parts[:frames]
	}
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	s := strings.Join(parts, " < ")
	if n > frames {
		s += fmt.Sprintf(" < ... (%d more)", n-frames)
	}
	return s
}

func leakPlural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
