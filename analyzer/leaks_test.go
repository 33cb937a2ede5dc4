package analyzer

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"msmemscope/trace"

	"msmemscope/internal/safefs"
)

// seq builds a process's event sequence.
type seq struct{ evs []trace.Event }

func (s *seq) add(e trace.Event) *seq {
	e.ID = uint64(len(s.evs) + 1)
	e.Timestamp = 1000 + e.ID
	e.Pid, e.Tid = 42, 42
	s.evs = append(s.evs, e)
	return s
}

func (s *seq) malloc(id, size uint64, cstack string) *seq {
	return s.add(trace.Event{Kind: trace.KindMalloc, Type: trace.TypeHost, Device: trace.DeviceHost,
		AllocID: id, Ptr: 0x1000 * id, HasPtr: true, Size: size, Owner: "HOST", CStack: cstack})
}

func (s *seq) free(id uint64) *seq {
	return s.add(trace.Event{Kind: trace.KindFree, Type: trace.TypeHost, Device: trace.DeviceHost,
		AllocID: id, Ptr: 0x1000 * id, HasPtr: true})
}

func (s *seq) step() *seq {
	return s.add(trace.Event{Kind: trace.KindSystem, Type: trace.TypeStep})
}

func (s *seq) sys(typ string) *seq { return s.add(trace.Event{Kind: trace.KindSystem, Type: typ}) }

func (s *seq) rangeStart(id uint64, msg string) *seq {
	return s.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeRangeStart, Name: msg, MstxID: id})
}

func (s *seq) rangeEnd(id uint64) *seq {
	return s.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeRangeEnd, MstxID: id})
}

// analyze numbers the steps as the pipeline does (pre-scan, then a tracker)
// and runs the leak analysis.
func (s *seq) analyze() *LeakReport {
	tr := &trace.StepTracker{UseStepCalls: trace.HasStepCalls(s.evs)}
	a := NewLeakAnalyzer()
	for i := range s.evs {
		tr.Observe(&s.evs[i])
		a.Observe(&s.evs[i])
	}
	return a.Finish()
}

func allocIDs(ls []Leak) []uint64 {
	var ids []uint64
	for _, l := range ls {
		ids = append(ids, l.AllocID)
	}
	return ids
}

func TestStepLeaksWithStepCalls(t *testing.T) {
	s := &seq{}
	s.sys(trace.TypeStart).
		malloc(1, 10, "init a.c:1 (a)"). // step 1: never a step leak
		step().                          // ends step 1
		malloc(2, 20, "leak b.c:2 (b)"). // step 2, alive at the end of step 3: leak
		malloc(3, 30, "").               // step 2, freed in step 3: fine
		malloc(4, 40, "").               // step 2, freed in step 2: fine
		free(4).
		step(). // ends step 2
		free(3).
		malloc(5, 50, "late c.c:3 (c)"). // step 3, alive when step 4 ends (the last event): leak
		step().                          // ends step 3: reports block 2
		free(2).                         // reported once, and not an exit leak
		free(99).                        // unknown: ignored
		step()                           // ends step 4, the last event: reports block 5
	r := s.analyze()
	if got := allocIDs(r.StepLeaks); !reflect.DeepEqual(got, []uint64{2, 5}) {
		t.Fatalf("step leaks %v, want [2 5]", got)
	}
	l := r.StepLeaks[0]
	want := Leak{AllocID: 2, Ptr: 0x2000, Size: 20, Step: 2, Type: trace.TypeHost, Device: trace.DeviceHost,
		Owner: "HOST", CStack: "leak b.c:2 (b)", MallocID: 4, Timestamp: 1004}
	if !reflect.DeepEqual(l, want) {
		t.Errorf("leak = %+v\nwant %+v", l, want)
	}
	if r.StepLeaks[1].Step != 3 {
		t.Errorf("block 5 step = %d", r.StepLeaks[1].Step)
	}
	if r.Steps != 4 {
		t.Errorf("Steps = %d", r.Steps)
	}
	if r.ExitBlocks != 2 || r.ExitBytes != 60 || len(r.ExitLeaks) != 2 {
		t.Errorf("exit leaks: %d blocks %d bytes %d groups", r.ExitBlocks, r.ExitBytes, len(r.ExitLeaks))
	}
}

func TestStepLeakNotYetOneFullStep(t *testing.T) {
	// Step 3 never ends: the block of step 2 is not judged (only an exit leak).
	s := &seq{}
	s.step().malloc(1, 8, "").step().add(trace.Event{Kind: trace.KindOpLaunch, Type: "ATEN_START", Name: "aten::add"})
	r := s.analyze()
	if len(r.StepLeaks) != 0 || r.ExitBlocks != 1 {
		t.Fatalf("step leaks %v, exit blocks %d", allocIDs(r.StepLeaks), r.ExitBlocks)
	}
}

func TestStepLeaksWithMstxRanges(t *testing.T) {
	s := &seq{}
	s.sys(trace.TypeStart).
		rangeStart(1, trace.StepRangeMessage). // step 1
		malloc(1, 10, "").                     // step 1: not a step leak
		rangeEnd(1).
		malloc(2, 5, ""). // between steps (step 0): not judged
		rangeStart(2, trace.StepRangeMessage).
		rangeStart(3, "forward"). // not a step range
		malloc(3, 300, "leak_step demo.c:23 (demo);main demo.c:40 (demo)").
		malloc(4, 400, "").
		rangeEnd(3).
		rangeEnd(2). // ends step 2
		rangeStart(4, trace.StepRangeMessage).
		free(4).     // freed within the next step: fine
		rangeEnd(4). // ends step 3: block 3 leaked
		rangeStart(5, trace.StepRangeMessage).
		free(3).
		malloc(6, 60, "").
		rangeEnd(5).
		rangeStart(6, trace.StepRangeMessage).
		rangeEnd(6). // ends step 5 as the last event: block 6 leaked
		sys(trace.TypeProcessExit)
	r := s.analyze()
	if got := allocIDs(r.StepLeaks); !reflect.DeepEqual(got, []uint64{3, 6}) {
		t.Fatalf("step leaks %v, want [3 6]", got)
	}
	if r.StepLeaks[0].Step != 2 || r.StepLeaks[1].Step != 4 {
		t.Errorf("steps %d %d", r.StepLeaks[0].Step, r.StepLeaks[1].Step)
	}
	if r.Steps != 5 {
		t.Errorf("Steps = %d", r.Steps)
	}
	// Exit leaks: 1, 2 and 6.
	if r.ExitBlocks != 3 || r.ExitBytes != 75 {
		t.Errorf("exit: %d blocks %d bytes", r.ExitBlocks, r.ExitBytes)
	}

	// The same, ending right at the Range_end of step 5.
	s.evs = s.evs[:len(s.evs)-1]
	for i := range s.evs {
		s.evs[i].Step = 0
	}
	if got := allocIDs(s.analyze().StepLeaks); !reflect.DeepEqual(got, []uint64{3, 6}) {
		t.Errorf("ending at Range_end: step leaks %v, want [3 6]", got)
	}
}

func TestExitLeaksGroupedAndSorted(t *testing.T) {
	s := &seq{}
	s.malloc(1, 100, "x_alloc x.c:1 (x);main m.c:9 (m)").
		malloc(2, 100, "x_alloc x.c:1 (x);main m.c:9 (m)").
		malloc(3, 300, "leak_step demo.c:23 (demo);main demo.c:40 (demo)").
		malloc(4, 150, "z_alloc z.c:1 (z)").
		malloc(5, 50, "z_alloc z.c:1 (z)").
		malloc(6, 200, "w_alloc w.c:1 (w)").
		malloc(7, 7, "").
		add(trace.Event{Kind: trace.KindMalloc, Type: trace.TypePTA, AllocID: 8, Size: 8, Ptr: 8, HasPtr: true, PyStack: "model.py:12(__init__)"}).
		malloc(9, 1000, "freed f.c:1 (f)").
		add(trace.Event{Kind: trace.KindMalloc, Type: trace.TypeHost, AllocID: 10, Size: 64, Shadow: true}).
		free(9).
		free(10)
	r := s.analyze()
	var stacks []string
	var counts []int
	var bytes []uint64
	for _, g := range r.ExitLeaks {
		stacks = append(stacks, g.Stack)
		counts = append(counts, g.Count)
		bytes = append(bytes, g.Bytes)
	}
	wantStacks := []string{
		"leak_step demo.c:23 (demo);main demo.c:40 (demo)",
		"x_alloc x.c:1 (x);main m.c:9 (m)", // 200 in 2, ties with z: stack order
		"z_alloc z.c:1 (z)",
		"w_alloc w.c:1 (w)", // 200 in 1 block
		"model.py:12(__init__)",
		LeakNoStack,
	}
	if !reflect.DeepEqual(stacks, wantStacks) {
		t.Fatalf("groups %q\nwant %q", stacks, wantStacks)
	}
	if !reflect.DeepEqual(counts, []int{1, 2, 2, 1, 1, 1}) || !reflect.DeepEqual(bytes, []uint64{300, 200, 200, 200, 8, 7}) {
		t.Errorf("counts %v bytes %v", counts, bytes)
	}
	if got := allocIDs(r.ExitLeaks[2].Blocks); !reflect.DeepEqual(got, []uint64{4, 5}) {
		t.Errorf("z blocks %v", got)
	}
	if r.ExitBlocks != 8 || r.ExitBytes != 915 {
		t.Errorf("totals %d blocks %d bytes", r.ExitBlocks, r.ExitBytes)
	}

	sum := r.Summary(2)
	if !strings.Contains(sum, "leak_step demo.c:23 (demo)") {
		t.Errorf("summary lacks the largest site's innermost frame:\n%s", sum)
	}
	if i, j := strings.Index(sum, "leak_step"), strings.Index(sum, "x_alloc"); i < 0 || j < i {
		t.Errorf("largest site not first:\n%s", sum)
	}
	if strings.Contains(sum, "z_alloc") || !strings.Contains(sum, "4 more call sites") {
		t.Errorf("summary not cut at top 2:\n%s", sum)
	}
	if !strings.Contains(sum, "8 blocks (915 B)") {
		t.Errorf("summary totals:\n%s", sum)
	}
}

func TestLeakReportWriteCSV(t *testing.T) {
	s := &seq{}
	s.malloc(1, 4096, "leak_step demo.c:23 (demo);main demo.c:40 (demo)").
		step().
		malloc(2, 100, `a,"b"`).
		add(trace.Event{Kind: trace.KindMalloc, Type: trace.TypePTA, Device: "0", AllocID: 3, Size: 50, Ptr: 0x30, HasPtr: true,
			Owner: "PTA@model@weight", CStack: `a,"b"`, PyStack: "m.py:1(f)"}).
		step(). // ends step 2
		step()  // ends step 3 as the last event
	r := s.analyze()
	if len(r.StepLeaks) != 2 {
		t.Fatalf("step leaks %v", allocIDs(r.StepLeaks))
	}
	var buf bytes.Buffer
	if err := r.WriteCSV(&buf); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		LeakCSVHeader,
		{"STEP", "N/A", "2", "2", "3", "1003", "HOST", "host", "0x2000", "100", "1", "HOST", "N/A", `a,"b"`},
		{"STEP", "N/A", "2", "3", "4", "1004", "PTA", "0", "0x30", "50", "1", "PTA@model@weight", "m.py:1(f)", `a,"b"`},
		{"EXIT", "N/A", "N/A", "N/A", "1", "1001", "HOST", "host", "0x1000", "4096", "1", "HOST", "N/A", "leak_step demo.c:23 (demo);main demo.c:40 (demo)"},
		{"EXIT", "N/A", "N/A", "N/A", "3", "1003", "HOST|PTA", "host|0", "0x2000", "150", "2", "HOST|PTA@model@weight", "N/A", `a,"b"`},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("report rows:\n%q\nwant\n%q", rows, want)
	}
}

func TestLeakSummaryEmpty(t *testing.T) {
	r := NewLeakAnalyzer().Finish()
	if got := r.Summary(5); !strings.HasPrefix(got, "leaks: 0 step leaks (0 B) over 0 steps; 0 blocks (0 B) alive at exit from 0 call sites") {
		t.Errorf("summary %q", got)
	}
	var buf bytes.Buffer
	if err := r.WriteCSV(&buf); err != nil || strings.Count(buf.String(), "\n") != 1 {
		t.Errorf("empty report %q %v", buf.String(), err)
	}
}

func TestLeakHelpers(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := safefs.HumanBytes(n); got != want {
			t.Errorf("HumanBytes(%d) = %q, want %q", n, got, want)
		}
	}
	if got := leakCallSite("a;b;c;d", 2); got != "a < b < ... (2 more)" {
		t.Errorf("leakCallSite = %q", got)
	}
}

// With the scan's kinds, exit leaks group by kind and call stack, definitely
// lost first whatever their size, and the summary gives valgrind's totals.
func TestExitLeaksByKind(t *testing.T) {
	a := NewLeakAnalyzer()
	for i, sz := range []uint64{10, 1000, 20, 30} {
		a.Observe(&trace.Event{Kind: trace.KindMalloc, Type: trace.TypeHost, AllocID: uint64(i + 1), ID: uint64(i + 1), Size: sz, CStack: "s"})
	}
	kinds := map[uint64]string{1: "definitely_lost", 2: "still_reachable", 3: "definitely_lost", 4: "indirectly_lost"}
	a.SetKinds(func(id uint64) (string, bool) { return kinds[id], true })
	r := a.Finish()
	var got []string
	for _, g := range r.ExitLeaks {
		got = append(got, fmt.Sprintf("%s:%d:%d", g.Kind, g.Count, g.Bytes))
	}
	if want := []string{"definitely_lost:2:30", "indirectly_lost:1:30", "still_reachable:1:1000"}; !reflect.DeepEqual(got, want) {
		t.Errorf("groups %v, want %v", got, want)
	}
	sum := r.Summary(5)
	if !strings.Contains(sum, "leak summary: definitely lost: 30 B in 2 blocks, indirectly lost: 30 B in 1 block, possibly lost: 0 B in 0 blocks, still reachable: 1000 B in 1 block") {
		t.Errorf("summary:\n%s", sum)
	}
}

// TestStepLeaksMany: steps of 100 blocks (all in the live blocks' recent
// slots when judged) and of 10,000 (more than those slots hold): a tenth
// live until three steps later (step leaks, each once, by step and in
// allocation order), a tenth freed in the next step (none), the rest freed
// at once.
func TestStepLeaksMany(t *testing.T) {
	for _, perStep := range []int{100, 10_000} {
		s := &seq{}
		s.sys(trace.TypeStart)
		const steps = 6
		later := map[int][]uint64{} // step -> ids to free then
		var want []uint64
		id := uint64(0)
		for step := 1; step <= steps; step++ {
			for _, f := range later[step] {
				s.free(f)
			}
			for i := 0; i < perStep; i++ {
				id++
				s.malloc(id, 8, "")
				switch i % 10 {
				case 0:
					later[step+3] = append(later[step+3], id)
					if step >= 2 && step < steps { // step+1 has ended (the last event ends the last step)
						want = append(want, id)
					}
				case 1:
					later[step+1] = append(later[step+1], id)
				default:
					s.free(id)
				}
			}
			s.step()
		}
		got := allocIDs(s.analyze().StepLeaks)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%d blocks a step: %d step leaks, want %d (first got %v, want %v)", perStep, len(got), len(want), got[:min(5, len(got))], want[:min(5, len(want))])
		}
	}
}

// TestStepLeakLargestID: a block of the largest allocation id is a step
// leak and an exit leak as any other.
func TestStepLeakLargestID(t *testing.T) {
	s := &seq{}
	s.step().malloc(math.MaxUint64, 8, "").step().step()
	r := s.analyze()
	if got := allocIDs(r.StepLeaks); !reflect.DeepEqual(got, []uint64{math.MaxUint64}) || r.ExitBlocks != 1 {
		t.Fatalf("step leaks %v, exit blocks %d; want the block in both", got, r.ExitBlocks)
	}
}
