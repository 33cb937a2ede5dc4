package analyzer

import (
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
