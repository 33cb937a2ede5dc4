package analyzer

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"

	"msmemscope/trace"
)

func TestDecomposePeakAndEnd(t *testing.T) {
	a := NewDecomposeAnalyzer()
	ev := []*trace.Event{
		{Kind: trace.KindMalloc, Type: "PTA", AllocID: 1, Size: 100, Owner: "PTA@model@weight"},
		{Kind: trace.KindMalloc, Type: "PTA", AllocID: 2, Size: 40, Owner: "PTA@activation"},
		{Kind: trace.KindMalloc, Type: "PTA", AllocID: 3, Size: 60, Owner: "PTA@activation"},
		{Kind: trace.KindFree, Type: "PTA", AllocID: 2, Size: 40},
		{Kind: trace.KindMalloc, Type: "HOST", AllocID: 4, Size: 7, Owner: "HOST"},
		{Kind: trace.KindMalloc, Type: "MMAP", AllocID: 5, Size: 4096, Owner: "HOST@mmap"},
		{Kind: trace.KindFree, Type: "PTA", AllocID: 3, Size: 60},
		{Kind: trace.KindFree, Type: "PTA", AllocID: 99, Size: 1}, // never allocated: ignored
	}
	for _, e := range ev {
		a.Observe(e)
	}
	r := a.Finish()
	for _, c := range []struct {
		name      string
		peak, end uint64
	}{{"weight", 100, 100}, {"activation", 100, 0}, {"HOST", 7, 7}, {"HOST@mmap", 4096, 4096}} {
		s := r.Category(c.name)
		if s.Peak != c.peak || s.End != c.end {
			t.Errorf("%s: peak %d end %d, want %d %d", c.name, s.Peak, s.End, c.peak, c.end)
		}
	}
	var sb strings.Builder
	if err := r.WriteCSV(&sb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "owner,PTA@model@weight,100,100,1\n") {
		t.Errorf("csv:\n%s", sb.String())
	}
}

// A CUDA device's lines: tensor blocks (one a driver block of
// cudaMallocAsync's), PyTorch's segment, another library's block, and the
// device's used bytes at a SNAPSHOT.
func TestDecomposeDeviceLines(t *testing.T) {
	a := NewDecomposeAnalyzer()
	id := uint64(0)
	ev := func(kind trace.Kind, typ, owner string, ptr, size uint64, extra ...trace.KV) *trace.Event {
		if kind == trace.KindMalloc {
			id++
		}
		return &trace.Event{Kind: kind, Type: typ, Device: "0", Pid: 1, AllocID: id, Owner: owner, Ptr: ptr, Size: size, Extra: extra}
	}
	const M = 1 << 20
	a.Observe(ev(trace.KindMalloc, trace.TypeHAL, "HAL@pytorch", 0x7e0000000000, 8*M))
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA@weight", 0x7e0000000000, 2*M))
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA@aten", 0x7e0000200000, 3*M))
	a.Observe(ev(trace.KindFree, trace.TypePTA, "", 0x7e0000200000, 0)) // the aten block
	// a tensor in a segment reserved before the capture: in no segment it knows
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA@activation", 0x7f0000000000, 1*M))
	// expandable segments: a handle of PyTorch's, mapped; a tensor inside
	a.Observe(ev(trace.KindMalloc, trace.TypeHAL, "HAL@pytorch", 0x1000, 2*M, trace.KV{Key: "kind", Value: "vmm"}))
	a.Observe(&trace.Event{Kind: trace.KindMap, Type: trace.TypeHAL, Device: "0", Ptr: 0x7c0000000000,
		Extra: []trace.KV{{Key: "size", Value: strconv.Itoa(2 * M)}, {Key: "offset", Value: "0"}, {Key: "handle", Value: "0x1000"}}})
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA@gradient", 0x7c0000100000, M/2))
	lib := ev(trace.KindMalloc, trace.TypeHAL, "HAL", 0x7d0000000000, 4*M)
	lib.Site = "ws<int, int> libcublas.so+0x10" // a site with a comma: quoted in the CSV
	a.Observe(lib)
	nccl := ev(trace.KindMalloc, trace.TypeHAL, "HAL", 0x7d0001000000, 1*M)
	nccl.CStack = "ncclInit libnccl.so+0x20;main prog+0x30" // no site: the stack's first frame
	a.Observe(nccl)
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA", 0x7d0002000000, 1*M, trace.KV{Key: "kind", Value: "device"}))
	a.Observe(&trace.Event{Kind: trace.KindSnapshot, Device: "0", Extra: []trace.KV{{Key: "used", Value: strconv.Itoa(20 * M)}}})
	a.Observe(&trace.Event{Kind: trace.KindMalloc, Type: trace.TypeHost, Device: trace.DeviceHost, Pid: 1, AllocID: 99, Size: 7})
	r := a.Finish()
	if len(r.Devices) != 1 || r.Devices[0].Device != "cuda:0" {
		t.Fatalf("devices %+v, want cuda:0 alone", r.Devices)
	}
	got := map[string][2]uint64{}
	for _, s := range r.Devices[0].Lines {
		got[s.Name] = [2]uint64{s.Peak, s.End}
	}
	// requested: weight 2 + activation 1 + gradient 0.5 + the async block 1;
	// cached_free: (8 + 2) - (weight 2 + gradient 0.5)
	want := map[string][2]uint64{"weight": {2 * M, 2 * M}, "aten": {3 * M, 0}, "activation": {M, M},
		"gradient": {M / 2, M / 2}, "requested": {5 * M, 4*M + M/2},
		"reserved": {10 * M, 10 * M}, "cached_free": {8 * M, 7*M + M/2}, "outside_pytorch": {5 * M, 5 * M},
		"outside_pytorch at ws<int, int> libcublas.so+0x10": {4 * M, 4 * M},
		"outside_pytorch at ncclInit libnccl.so+0x20":       {1 * M, 1 * M},
		"context_inferred": {4 * M, 4 * M}} // 20 - (10 + 5 + 1)
	if !maps.Equal(got, want) {
		t.Errorf("lines %v\nwant %v", got, want)
	}
	var b strings.Builder
	if err := r.WriteCSV(&b); err != nil || !strings.Contains(b.String(), "\ncuda:0,cached_free,8388608,7864320,0\n") ||
		!strings.Contains(b.String(), "\ncuda:0,outside_pytorch,5242880,5242880,0\n"+
			`cuda:0,"outside_pytorch at ws<int, int> libcublas.so+0x10",4194304,4194304,1`+"\n"+
			"cuda:0,outside_pytorch at ncclInit libnccl.so+0x20,1048576,1048576,1\ncuda:0,context_inferred,") {
		t.Errorf("CSV %q (%v)", b.String(), err)
	}
}

// A tensor block whose row comes before its segment's (two clocks stamp
// them) is counted inside the segment once the segment's row comes.
func TestDecomposeTensorBeforeItsSegment(t *testing.T) {
	a := NewDecomposeAnalyzer()
	const M = 1 << 20
	a.Observe(&trace.Event{Kind: trace.KindMalloc, Type: trace.TypePTA, Device: "0", Pid: 1, AllocID: 1, Owner: "PTA", Ptr: 0x7e0000100000, Size: M})
	a.Observe(&trace.Event{Kind: trace.KindMalloc, Type: trace.TypeHAL, Device: "0", Pid: 1, AllocID: 2, Owner: "HAL@pytorch", Ptr: 0x7e0000000000, Size: 4 * M})
	found := false
	for _, s := range a.Finish().Devices[0].Lines {
		if s.Name == "cached_free" {
			found = true
			if s.Peak != 3*M || s.End != 3*M {
				t.Errorf("cached_free peak %d end %d, want 3 MiB both", s.Peak, s.End)
			}
		}
	}
	if !found {
		t.Error("no cached_free line")
	}
}

// A capture without blocks says so, not an empty table.
func TestDecomposeSummaryOfNothing(t *testing.T) {
	if got := (&DecomposeReport{}).Summary(); got != "decompose (peak / end bytes per owner):\n  none: no block was recorded\n" {
		t.Errorf("summary %q", got)
	}
}

// The console lists the owners within the categories (describe() tags,
// PyTorch's roles), which it left to the CSV, and stops at ten.
func TestDecomposeSummaryListsOwners(t *testing.T) {
	r := &DecomposeReport{
		Categories: []DecomposeStat{{Name: "HOST", Peak: 5000, End: 100, Blocks: 9}},
		Owners:     []DecomposeStat{{Name: "HOST@loader", Peak: 3500, Blocks: 2}, {Name: "HOST", Peak: 5000, End: 100, Blocks: 9}},
	}
	got := r.Summary()
	if !strings.Contains(got, "\n    HOST@loader    peak         3500  end            0  (2 allocations)\n") || strings.Count(got, "HOST ") != 1 {
		t.Errorf("summary:\n%s", got)
	}
	for i := 0; i < 12; i++ {
		r.Owners = append(r.Owners, DecomposeStat{Name: fmt.Sprintf("HOST@t%d", i), Peak: 1})
	}
	if got := r.Summary(); !strings.Contains(got, "… 3 owners more in the decompose CSV") {
		t.Errorf("summary of 13 owners:\n%s", got)
	}
}
