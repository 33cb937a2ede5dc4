package analyzer

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"msmemscope/internal/intern"
	"msmemscope/trace"

	"msmemscope/internal/safefs"
)

// Compare (SPEC §5.2): the launch sequences of two captures are aligned by a
// minimal edit script (Myers), and each aligned launch's memory is compared:
// the bytes it allocated net, that is the sizes of the MALLOCs minus those of
// the FREEs from its start to the next launch of the same kind. Launches are
// OP_LAUNCH ATEN_START rows, or KERNEL_LAUNCH rows when either capture has
// no operator launch. Memory events before the first launch belong to none.

// CompareCSVHeader is the header of memory_compare_{timestamp}.csv (§2.4).
// The last four name the launch on each side: its index (the n-th launch of
// that kind in its capture, from 1) and its step, so that repeated launches
// of one operator can be told apart.
var CompareCSVHeader = []string{"Event", "Name", "Device Id", "Base Allocated Memory(byte)", "Compare Allocated Memory(byte)", "Diff Memory(byte)",
	"Base Index", "Compare Index", "Base Step", "Compare Step"}

// launch is one launch of a sequence, its name and device interned.
type launch struct {
	name, device   int32
	step, callStep int32 // its step by mstx ranges, and by step() calls
	net            int64
}

// LaunchSeq is the launches of one capture.
type LaunchSeq struct {
	Name   string // where it came from
	Rows   uint64
	op     []launch
	kernel []launch
}

// Comparer compares two captures read as streams.
type Comparer struct {
	names intern.Table // launch names and devices, for both sequences
}

// NewComparer returns a Comparer.
func NewComparer() *Comparer {
	return &Comparer{}
}

// Launches reads a capture's launch sequences. Memory grows with the number
// of launches (24 bytes each), not with the number of events.
func (c *Comparer) Launches(s trace.Stream, name string) (*LaunchSeq, error) {
	seq := &LaunchSeq{Name: name}
	curOp, curKernel := -1, -1
	// The step source (SPEC §3) is known only at the end (whether step()
	// was ever called): both are kept, and the end picks one; s needs its
	// MSTX and SYSTEM rows for that.
	ranges, calls := &trace.StepTracker{}, &trace.StepTracker{UseStepCalls: true}
	stepCalls := false
	err := trace.Each(s, func(e *trace.Event) error {
		seq.Rows++
		ranges.Observe(e)
		rangeStep := int32(e.Step)
		calls.Observe(e)
		callStep := int32(e.Step)
		stepCalls = stepCalls || trace.IsStepCall(e)
		switch e.Kind {
		case trace.KindOpLaunch:
			if e.Type == "ATEN_START" {
				seq.op = append(seq.op, launch{name: c.names.ID(e.Name), device: c.names.ID(e.Device), step: rangeStep, callStep: callStep})
				curOp = len(seq.op) - 1
			}
		case trace.KindKernelLaunch:
			seq.kernel = append(seq.kernel, launch{name: c.names.ID(e.Name), device: c.names.ID(e.Device), step: rangeStep, callStep: callStep})
			curKernel = len(seq.kernel) - 1
		case trace.KindMalloc, trace.KindFree:
			d := int64(e.Size)
			if e.Kind == trace.KindFree {
				d = -d
			}
			if curOp >= 0 {
				seq.op[curOp].net += d
			}
			if curKernel >= 0 {
				seq.kernel[curKernel].net += d
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if stepCalls {
		for _, l := range [][]launch{seq.op, seq.kernel} {
			for i := range l {
				l[i].step = l[i].callStep
			}
		}
	}
	return seq, nil
}

// CompareRow is one line of the comparison.
type CompareRow struct {
	Event   string `json:"event"`
	Name    string `json:"name"`
	Device  string `json:"device"`
	Base    *int64 `json:"base"`    // nil: no such launch in the base capture
	Compare *int64 `json:"compare"` // nil: none in the compared capture
	Diff    int64  `json:"diff"`    // Compare - Base, a missing side counting 0
	Order   int    `json:"order"`   // position in the alignment
	// The launch on each side: its index among its capture's launches of
	// that kind (from 1) and its step; 0 where that side has none.
	BaseIndex    int `json:"base_index"`
	CompareIndex int `json:"compare_index"`
	BaseStep     int `json:"base_step"`
	CompareStep  int `json:"compare_step"`
}

// CompareReport is the result of a comparison.
type CompareReport struct {
	Base, Compare  string
	Event          string // OP_LAUNCH or KERNEL_LAUNCH
	BaseLaunches   int
	CmpLaunches    int
	Matched        int
	BaseOnly       int
	CompareOnly    int
	Rows           []CompareRow // by |Diff| descending, then alignment order
	BaseTotal      int64
	CompareTotal   int64
	EditDistance   int
	DifferentCount int // matched launches whose memory differs
}

// Compare aligns base and cmp and compares their launches' memory.
func (c *Comparer) Compare(base, cmpSeq *LaunchSeq) (*CompareReport, error) {
	kind := "OP_LAUNCH"
	a, b := base.op, cmpSeq.op
	switch {
	case len(a) > 0 && len(b) > 0:
	case len(base.kernel) > 0 && len(cmpSeq.kernel) > 0:
		kind = "KERNEL_LAUNCH"
		a, b = base.kernel, cmpSeq.kernel
	case len(base.op)+len(base.kernel) == 0:
		return nil, fmt.Errorf("no launches to compare in %s (no OP_LAUNCH ATEN_START or KERNEL_LAUNCH rows)", base.Name)
	case len(cmpSeq.op)+len(cmpSeq.kernel) == 0:
		return nil, fmt.Errorf("no launches to compare in %s (no OP_LAUNCH ATEN_START or KERNEL_LAUNCH rows)", cmpSeq.Name)
	default:
		return nil, fmt.Errorf("cannot compare: %s and %s hold different kinds of launches (OP_LAUNCH in one, KERNEL_LAUNCH in the other)", base.Name, cmpSeq.Name)
	}
	ka := make([]int32, len(a))
	kb := make([]int32, len(b))
	for i := range a {
		ka[i] = a[i].name
	}
	for i := range b {
		kb[i] = b[i].name
	}
	pairs := Align(ka, kb)
	r := &CompareReport{Base: base.Name, Compare: cmpSeq.Name, Event: kind, BaseLaunches: len(a), CmpLaunches: len(b)}
	r.Rows = make([]CompareRow, 0, len(pairs))
	for order, p := range pairs {
		row := CompareRow{Event: kind, Order: order}
		if p.A >= 0 {
			l := a[p.A]
			v := l.net
			row.Base = &v
			row.BaseIndex, row.BaseStep = p.A+1, int(l.step)
			row.Name, row.Device = c.names.Name(l.name), c.names.Name(l.device)
			r.BaseTotal += v
			row.Diff -= v
		}
		if p.B >= 0 {
			l := b[p.B]
			v := l.net
			row.Compare = &v
			row.CompareIndex, row.CompareStep = p.B+1, int(l.step)
			if p.A < 0 {
				row.Name, row.Device = c.names.Name(l.name), c.names.Name(l.device)
			}
			r.CompareTotal += v
			row.Diff += v
		}
		switch {
		case p.A >= 0 && p.B >= 0:
			r.Matched++
			if row.Diff != 0 {
				r.DifferentCount++
			}
		case p.A >= 0:
			r.BaseOnly++
		default:
			r.CompareOnly++
		}
		r.Rows = append(r.Rows, row)
	}
	r.EditDistance = r.BaseOnly + r.CompareOnly
	slices.SortStableFunc(r.Rows, func(x, y CompareRow) int { return cmp.Compare(absDiff(y.Diff), absDiff(x.Diff)) })
	return r, nil
}

func absDiff(d int64) uint64 {
	if d < 0 {
		return uint64(-d)
	}
	return uint64(d)
}

// WriteCSV writes memory_compare CSV (SPEC §2.4).
func (r *CompareReport) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CompareCSVHeader); err != nil {
		return err
	}
	num := func(p *int64) string {
		if p == nil {
			return trace.NA
		}
		return strconv.FormatInt(*p, 10)
	}
	// index and step of one side: N/A where that side has no launch (a
	// launch before the first step is in step 0).
	side := func(present *int64, v int) string {
		if present == nil {
			return trace.NA
		}
		return strconv.Itoa(v)
	}
	for i := range r.Rows {
		x := &r.Rows[i]
		if err := cw.Write([]string{x.Event, leakNA(x.Name), leakNA(x.Device), num(x.Base), num(x.Compare), strconv.FormatInt(x.Diff, 10),
			side(x.Base, x.BaseIndex), side(x.Compare, x.CompareIndex), side(x.Base, x.BaseStep), side(x.Compare, x.CompareStep)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// Summary is the console report: totals and the top largest differences.
func (r *CompareReport) Summary(top int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "compare: %d %s launches in %s, %d in %s: %d aligned (%d with a different allocation), %d only in base, %d only in compare\n",
		r.BaseLaunches, r.Event, r.Base, r.CmpLaunches, r.Compare, r.Matched, r.DifferentCount, r.BaseOnly, r.CompareOnly)
	fmt.Fprintf(&b, "  net allocated by launches: base %s, compare %s, diff %s\n", signedBytes(r.BaseTotal), signedBytes(r.CompareTotal), signedBytes(r.CompareTotal-r.BaseTotal))
	n := 0
	for i := range r.Rows {
		if r.Rows[i].Diff != 0 {
			n++
		}
	}
	if n == 0 {
		b.WriteString("  no launch allocates differently\n")
		return b.String()
	}
	fmt.Fprintf(&b, "  largest differences (of %d):\n", n)
	fmt.Fprintf(&b, "    %-14s %-40s %-8s %14s %14s %14s\n", "Event", "Name", "Device", "Base", "Compare", "Diff")
	num := func(p *int64) string {
		if p == nil {
			return trace.NA
		}
		return strconv.FormatInt(*p, 10)
	}
	for i := range r.Rows[:min(top, n)] {
		x := &r.Rows[i]
		name := x.Name
		if len(name) > 40 {
			name = name[:37] + "..."
		}
		fmt.Fprintf(&b, "    %-14s %-40s %-8s %14s %14s %+14d\n", x.Event, leakNA(name), leakNA(x.Device), num(x.Base), num(x.Compare), x.Diff)
	}
	if n > top {
		fmt.Fprintf(&b, "    ... and %d more\n", n-top)
	}
	return b.String()
}

func signedBytes(n int64) string {
	if n < 0 {
		return "-" + safefs.HumanBytes(uint64(-n))
	}
	return safefs.HumanBytes(uint64(n))
}

// ---------------------------------------------------------------------------
// Myers' O((N+M)D) difference algorithm, linear-space version (Myers 1986,
// section 4b): the middle snake splits the problem in two.

// Pair is one step of an alignment: A and B index the two sequences; -1 on
// one side means a launch present on the other side only.
type Pair struct{ A, B int }

// Align returns a minimal edit script between a and b as an alignment: the
// matched elements (a longest common subsequence) in order, with the
// elements of a deleted and of b inserted between them (deletions first).
func Align[T comparable](a, b []T) []Pair {
	out := make([]Pair, 0, max(len(a), len(b)))
	n, m := len(a), len(b)
	size := 2*(n+m) + 2
	vf := make([]int, size)
	vb := make([]int, size)
	var rec func(a0, a1, b0, b1 int)
	emit := func(a0, a1, b0, b1 int) { // no common element: all deleted, all inserted
		for i := a0; i < a1; i++ {
			out = append(out, Pair{i, -1})
		}
		for j := b0; j < b1; j++ {
			out = append(out, Pair{-1, j})
		}
	}
	rec = func(a0, a1, b0, b1 int) {
		// Common prefix and suffix.
		for a0 < a1 && b0 < b1 && a[a0] == b[b0] {
			out = append(out, Pair{a0, b0})
			a0++
			b0++
		}
		var suffix int
		for a1 > a0 && b1 > b0 && a[a1-1] == b[b1-1] {
			a1--
			b1--
			suffix++
		}
		switch {
		case a0 == a1 || b0 == b1:
			emit(a0, a1, b0, b1)
		default:
			x, y, u, v := middleSnake(a, b, a0, a1, b0, b1, vf, vb)
			if (x == a0 && y == b0 && u == x) || (u == a1 && v == b1 && u == x) {
				emit(a0, a1, b0, b1) // no split (cannot happen: a guard against looping)
			} else {
				rec(a0, x, b0, y)
				for i := 0; i < u-x; i++ {
					out = append(out, Pair{x + i, y + i})
				}
				rec(u, a1, v, b1)
			}
		}
		for i := 0; i < suffix; i++ {
			out = append(out, Pair{a1 + i, b1 + i})
		}
	}
	rec(0, n, 0, m)
	return out
}

// middleSnake finds the middle snake of a[a0:a1] and b[b0:b1] (both non
// empty, first and last elements differing): the snake from (x,y) to (u,v),
// in absolute coordinates, lying on an optimal path.
func middleSnake[T comparable](a, b []T, a0, a1, b0, b1 int, vf, vb []int) (x, y, u, v int) {
	n, m := a1-a0, b1-b0
	delta := n - m
	odd := delta&1 != 0
	off := n + m + 1 // index offset for diagonals k in [-(n+m), n+m]
	maxD := (n + m + 1) / 2
	vf[off+1] = 0
	vb[off+1] = 0
	for d := 0; d <= maxD; d++ {
		// Forward: furthest reaching d-paths from (0,0).
		for k := -d; k <= d; k += 2 {
			var xs int
			if k == -d || (k != d && vf[off+k-1] < vf[off+k+1]) {
				xs = vf[off+k+1] // down: an insertion
			} else {
				xs = vf[off+k-1] + 1 // right: a deletion
			}
			ys := xs - k
			xe, ye := xs, ys
			for xe < n && ye < m && a[a0+xe] == b[b0+ye] {
				xe++
				ye++
			}
			vf[off+k] = xe
			if odd && k >= delta-(d-1) && k <= delta+(d-1) {
				// Overlaps the reverse (d-1)-path on diagonal k?
				if xe >= n-vb[off+delta-k] {
					return a0 + xs, b0 + ys, a0 + xe, b0 + ye
				}
			}
		}
		// Reverse: furthest reaching d-paths from (n,m), in reversed
		// coordinates: vb[k'] is how far from the end along diagonal
		// k' = (n-x)-(m-y).
		for k := -d; k <= d; k += 2 {
			var xs int
			if k == -d || (k != d && vb[off+k-1] < vb[off+k+1]) {
				xs = vb[off+k+1]
			} else {
				xs = vb[off+k-1] + 1
			}
			ys := xs - k
			xe, ye := xs, ys
			for xe < n && ye < m && a[a1-1-xe] == b[b1-1-ye] {
				xe++
				ye++
			}
			vb[off+k] = xe
			if !odd && k >= delta-d && k <= delta+d {
				// Overlaps the forward d-path on diagonal delta-k?
				if xe >= n-vf[off+delta-k] {
					return a0 + n - xe, b0 + m - ye, a0 + n - xs, b0 + m - ys
				}
			}
		}
	}
	panic("middleSnake: no middle snake") // unreachable for valid input
}
