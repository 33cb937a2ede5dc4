package analyzer

import (
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
	ev := func(kind trace.Kind, typ, owner string, size uint64, extra ...trace.KV) *trace.Event {
		if kind == trace.KindMalloc {
			id++
		}
		return &trace.Event{Kind: kind, Type: typ, Device: "0", Pid: 1, AllocID: id, Owner: owner, Size: size, Extra: extra}
	}
	const M = 1 << 20
	a.Observe(ev(trace.KindMalloc, trace.TypeHAL, "HAL@pytorch", 8*M))
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA@weight", 2*M))
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA@aten", 3*M))
	a.Observe(ev(trace.KindFree, trace.TypePTA, "", 0)) // the aten block
	lib := ev(trace.KindMalloc, trace.TypeHAL, "HAL", 4*M)
	lib.Site = "ws<int, int> libcublas.so+0x10" // a site with a comma: quoted in the CSV
	a.Observe(lib)
	nccl := ev(trace.KindMalloc, trace.TypeHAL, "HAL", 1*M)
	nccl.CStack = "ncclInit libnccl.so+0x20;main prog+0x30" // no site: the stack's first frame
	a.Observe(nccl)
	a.Observe(ev(trace.KindMalloc, trace.TypePTA, "PTA", 1*M, trace.KV{Key: "kind", Value: "device"}))
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
	want := map[string][2]uint64{"weight": {2 * M, 2 * M}, "aten": {3 * M, 0}, "allocated": {5 * M, 3 * M},
		"reserved": {8 * M, 8 * M}, "cached_free": {8 * M, 6 * M}, "outside_pytorch": {5 * M, 5 * M},
		"outside_pytorch at ws<int, int> libcublas.so+0x10": {4 * M, 4 * M},
		"outside_pytorch at ncclInit libnccl.so+0x20":       {1 * M, 1 * M},
		"context_inferred": {6 * M, 6 * M}} // 20 - (8 + 5 + 1)
	if !maps.Equal(got, want) {
		t.Errorf("lines %v\nwant %v", got, want)
	}
	var b strings.Builder
	if err := r.WriteCSV(&b); err != nil || !strings.Contains(b.String(), "\ncuda:0,cached_free,8388608,6291456,0\n") ||
		!strings.Contains(b.String(), "\ncuda:0,outside_pytorch,5242880,5242880,0\n"+
			`cuda:0,"outside_pytorch at ws<int, int> libcublas.so+0x10",4194304,4194304,1`+"\n"+
			"cuda:0,outside_pytorch at ncclInit libnccl.so+0x20,1048576,1048576,1\ncuda:0,context_inferred,") {
		t.Errorf("CSV %q (%v)", b.String(), err)
	}
}
