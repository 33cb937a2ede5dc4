package export

import (
	"bytes"
	"encoding/json"
	"testing"

	"msmemscope/trace"
)

type jsonTrace struct {
	TraceEvents []struct {
		Ph   string         `json:"ph"`
		Name string         `json:"name"`
		Ts   float64        `json:"ts"`
		Pid  int64          `json:"pid"`
		Tid  int64          `json:"tid"`
		ID   string         `json:"id"`
		S    string         `json:"s"`
		Args map[string]any `json:"args"`
	} `json:"traceEvents"`
}

// The trace format's rules: every event has a phase the format defines; B
// and E nest per thread; b and e pair by id; counters carry numbers.
func TestPerfettoTraceRules(t *testing.T) {
	p := newPerfetto()
	p.SetProcess(42)
	ev := []trace.Event{
		{Kind: trace.KindMalloc, Type: trace.TypeHost, Owner: "HOST", AllocID: 1, Size: 100, Timestamp: 1000, Tid: 1},
		{Kind: trace.KindMstx, Type: trace.TypeRangeStart, Name: "step start", MstxID: 7, Timestamp: 2000, Tid: 1},
		{Kind: trace.KindOpLaunch, Type: trace.TypeAtenStart, Name: "aten::addmm", Timestamp: 3000, Tid: 1},
		{Kind: trace.KindMalloc, Type: trace.TypePTA, Owner: "PTA@aten", AllocID: 2, Size: 4096, Timestamp: 3500, Tid: 1},
		{Kind: trace.KindOpLaunch, Type: trace.TypeAtenStart, Name: "aten::mm", Timestamp: 3600, Tid: 1},
		{Kind: trace.KindKernelLaunch, Type: trace.TypeKernel, Name: "gemm", Device: "0", Timestamp: 3700, Tid: 1,
			Extra: []trace.KV{{Key: "grid", Value: "2x1x1"}}},
		{Kind: trace.KindOpLaunch, Type: trace.TypeAtenEnd, Name: "aten::mm", Timestamp: 3800, Tid: 1},
		{Kind: trace.KindOpLaunch, Type: trace.TypeAtenEnd, Name: "aten::addmm", Timestamp: 3900, Tid: 1},
		{Kind: trace.KindMstx, Type: trace.TypeRangeEnd, Name: "step start", MstxID: 7, Timestamp: 5000, Tid: 2},
		{Kind: trace.KindFree, Type: trace.TypePTA, AllocID: 2, Size: 4096, Timestamp: 6000, Tid: 1},
		{Kind: trace.KindOpLaunch, Type: trace.TypeAtenStart, Name: "aten::cut", Timestamp: 7000, Tid: 3}, // never ends
	}
	for i := range ev {
		p.Observe(&ev[i])
	}
	var b bytes.Buffer
	if err := p.Encode(&b); err != nil {
		t.Fatal(err)
	}
	var tr jsonTrace
	if err := json.Unmarshal(b.Bytes(), &tr); err != nil {
		t.Fatal(err)
	}
	stacks := map[int64][]string{}
	async := map[string]string{}
	var counters, kernels int
	peak := 0.0
	for _, e := range tr.TraceEvents {
		if e.Pid != 42 {
			t.Errorf("event %+v: pid %d, want 42", e, e.Pid)
		}
		switch e.Ph {
		case "M":
		case "B":
			stacks[e.Tid] = append(stacks[e.Tid], e.Name)
		case "E":
			s := stacks[e.Tid]
			if len(s) == 0 || s[len(s)-1] != e.Name {
				t.Fatalf("E %s on thread %d does not close the innermost slice (%v)", e.Name, e.Tid, s)
			}
			stacks[e.Tid] = s[:len(s)-1]
		case "b":
			async[e.ID] = e.Name
		case "e":
			if async[e.ID] != e.Name {
				t.Errorf("e %s id %s has no b", e.Name, e.ID)
			}
			delete(async, e.ID)
		case "C":
			counters++
			for _, v := range e.Args {
				if _, ok := v.(float64); !ok {
					t.Errorf("counter %s: %v is not a number", e.Name, v)
				}
			}
			if e.Name == "live bytes by type" {
				n := func(k string) float64 { v, _ := e.Args[k].(float64); return v }
				peak = max(peak, n("PTA")+n("HOST"))
			}
		case "i":
			if e.Name == "gemm" {
				kernels++
				if e.Args["grid"] != "2x1x1" || e.Args["device"] != "0" {
					t.Errorf("kernel args %v", e.Args)
				}
			}
		default:
			t.Errorf("phase %q is not one of the trace format's", e.Ph)
		}
	}
	for tid, s := range stacks {
		if len(s) != 0 {
			t.Errorf("thread %d: slices left open %v", tid, s)
		}
	}
	if len(async) != 0 || counters == 0 || kernels != 1 || peak != 4196 {
		t.Errorf("open ranges %v, %d counter samples, %d kernels, peak %v (want 4196)", async, counters, kernels, peak)
	}
}

// Past maxPoints the buckets double and keep each series' largest value.
func TestCounterCompactionKeepsPeaks(t *testing.T) {
	c := &counterTrack{width: 1}
	for i := 0; i < 3*maxPoints; i++ {
		v := int64(i % 7)
		if i == 123457 {
			v = 1000
		}
		c.add(uint64(i), map[string]int64{"x": v})
	}
	if len(c.points) > maxPoints || c.width < 4 {
		t.Fatalf("%d points of width %d", len(c.points), c.width)
	}
	top := int64(0)
	for _, p := range c.points {
		top = max(top, p.vals["x"])
	}
	if top != 1000 {
		t.Errorf("the peak became %d", top)
	}
}
