package export

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"msmemscope/trace"
)

type evs struct {
	list []trace.Event
	aid  uint64
}

func (s *evs) add(e trace.Event) {
	e.ID = uint64(len(s.list) + 1)
	e.Timestamp = 1_000_000 + e.ID*1000
	e.Pid, e.Tid = 7, 7
	s.list = append(s.list, e)
}

func (s *evs) malloc(typ, dev, stack string, size uint64) uint64 {
	s.aid++
	s.add(trace.Event{Kind: trace.KindMalloc, Type: typ, Device: dev, AllocID: s.aid, Size: size, Owner: typ, CStack: stack})
	return s.aid
}

func (s *evs) free(aid uint64) { s.add(trace.Event{Kind: trace.KindFree, AllocID: aid}) }

func (s *evs) report(kinds map[uint64]string) *ProcReport {
	h := newHTML()
	for i := range s.list {
		h.Observe(&s.list[i])
	}
	if kinds != nil {
		h.SetLeakKinds(func(id uint64) (string, bool) { k, ok := kinds[id]; return k, ok })
	}
	return h.Report()
}

func siteOf(r *ProcReport, fn string) *RSite {
	for i := range r.Sites {
		s := r.Sites[i].Stack
		if strings.HasPrefix(r.Frames[s[len(s)-1]], fn) {
			return &r.Sites[i]
		}
	}
	return nil
}

// The peak and what each site held then, the temporary allocations, and
// the framework's device blocks kept apart from the memory they lie in.
func TestHTMLPeakSitesTemporary(t *testing.T) {
	var s evs
	a := s.malloc("HOST", "host", "a x.c:1 (p);main x.c:9 (p)", 100)
	b := s.malloc("HOST", "host", "b x.c:2 (p);main x.c:9 (p)", 300)
	s.free(a)
	c := s.malloc("HOST", "host", "a x.c:1 (p);main x.c:9 (p)", 500) // the peak: 800 (b 300 + a's site 500)
	s.free(c)
	for i := 0; i < 7; i++ { // temporaries: freed before any other allocation
		s.free(s.malloc("HOST", "host", "tmp x.c:3 (p);main x.c:9 (p)", 10))
	}
	hal := s.malloc("HAL", "0", "cuMemAlloc (libcuda);main x.c:9 (p)", 1<<20)
	p1 := s.malloc("PTA", "0", "model.py:3(forward)", 4096) // inside hal: another view
	s.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeRangeStart, Name: trace.StepRangeMessage, MstxID: 5})
	d := s.malloc("HOST", "host", "leak x.c:4 (p);main x.c:9 (p)", 64)
	s.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeRangeEnd, Name: trace.StepRangeMessage, MstxID: 5})
	_, _ = p1, hal
	r := s.report(map[uint64]string{d: "definitely_lost", b: "still_reachable"})
	if r.Views[0].Peak != 1<<20+300+64 || r.Views[1].Peak != 4096 {
		t.Errorf("peaks %+v", r.Views)
	}
	// Before the HAL block, the host's peak was 800: a's site then held 500.
	if x := siteOf(r, "a "); x == nil || x.AllocN != 2 || x.AllocB != 600 || x.LiveB != 0 || x.TempN != 1 {
		t.Errorf("site a: %+v", x)
	}
	if x := siteOf(r, "tmp "); x == nil || x.TempN != 7 || x.AllocN != 7 {
		t.Errorf("site tmp: %+v", x)
	}
	if x := siteOf(r, "model.py:3(forward)"); x == nil || x.Type != "PTA (device 0)" || x.View != 1 || x.PeakB != 4096 {
		t.Errorf("the device's PTA site: %+v", x)
	}
	if top := r.Tops["temporary"]; len(top) == 0 || &r.Sites[top[0]] != siteOf(r, "tmp ") {
		t.Errorf("temporary top %v", top)
	}
	if len(r.Steps) != 1 {
		t.Fatalf("steps %+v", r.Steps)
	}
	kinds := map[string]RLeak{} // totals per kind
	for _, l := range r.Leaks {
		k := kinds[l.Kind]
		k.Bytes, k.Blocks, k.Step0 = k.Bytes+l.Bytes, k.Blocks+l.Blocks, l.Step0
		kinds[l.Kind] = k
	}
	if l := kinds["definitely_lost"]; l.Bytes != 64 || l.Blocks != 1 || l.Step0 != 1 || r.Leaks[0].Kind != "definitely_lost" {
		t.Errorf("leaks %+v", r.Leaks)
	}
	if l := kinds["still_reachable"]; l.Bytes != 300 || l.Step0 != 0 {
		t.Errorf("still reachable %+v", l)
	}
	if l := kinds[""]; l.Bytes != 1<<20+4096 || l.Blocks != 2 { // HAL and PTA: not judged
		t.Errorf("not judged %+v", kinds[""])
	}
	var buf bytes.Buffer
	if err := writeHTML(&buf, []*ProcReport{r}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"name":"PTA (device 0)","view":1`) {
		t.Errorf("page:\n%.1500s", buf.String())
	}
}

// A page's data cannot close its script: "</script>" in a frame is escaped.
func TestHTMLScriptSafe(t *testing.T) {
	var s evs
	s.malloc("HOST", "host", "</script><script>alert(1)</script> (p)", 8)
	var buf bytes.Buffer
	if err := writeHTML(&buf, []*ProcReport{s.report(nil)}, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Count(buf.String(), "</script>") != 2 {
		t.Errorf("the data closed its script:\n%s", buf.String())
	}
}

// BenchmarkHTML10M is the report of a 10 M-event capture (make bench
// reports it): 5 M blocks from 2,000 sites, freed in turn.
func BenchmarkHTML10M(b *testing.B) {
	stacks := make([]string, 2000)
	for i := range stacks {
		stacks[i] = "f" + strconv.Itoa(i) + " x.c:1 (p);g" + strconv.Itoa(i%50) + " x.c:2 (p);main x.c:9 (p)"
	}
	const n = 10_000_000
	for it := 0; it < b.N; it++ {
		h := newHTML()
		e := trace.Event{Pid: 1, Tid: 1, Type: "HOST", Device: "host", Owner: "HOST"}
		for i := uint64(0); i < n/2; i++ {
			e.Kind, e.AllocID, e.Size, e.CStack, e.Timestamp = trace.KindMalloc, i+1, 64+i%512, stacks[i%2000], 1000+i*100
			h.Observe(&e)
			if i >= 1000 {
				e.Kind, e.AllocID = trace.KindFree, i-999
				h.Observe(&e)
			}
		}
		var buf bytes.Buffer
		if err := h.Encode(&buf); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(buf.Len()), "bytes/page")
	}
}

// A type whose first blocks are 0 bytes (malloc(0)), on the host and as a
// device's framework blocks, and heaptrack's temporary allocation across
// kinds of memory: any other allocation in between makes a block not one.
func TestHTMLZeroBytesAndTemporary(t *testing.T) {
	var s evs
	s.malloc("HOST", "host", "zero x.c:1 (p)", 0)
	s.malloc("PTA", "0", "m.py:1(f)", 0)
	a := s.malloc("HOST", "host", "a x.c:2 (p)", 100)
	s.malloc("PTA", "0", "m.py:2(g)", 64) // another allocation: a is not temporary
	s.free(a)
	r := s.report(nil)
	if x := siteOf(r, "a "); x == nil || x.TempN != 0 {
		t.Errorf("site a: %+v, want no temporary allocation", x)
	}
	if r.Views[0].Peak != 100 || r.Views[1].Peak != 64 || len(r.Timeline.T) == 0 {
		t.Errorf("views %+v, timeline %d points", r.Views, len(r.Timeline.T))
	}
}

// Every timeline point has every type, then every owner, at the positions
// the report lists them: a type first seen after a point is 0 there (the
// chart read a HOST owner's bytes as PTA's before the first tensor).
func TestHTMLTimelineLayout(t *testing.T) {
	var s evs
	s.malloc("HOST", "host", "a x.c:1 (p)", 1000)
	s.add(trace.Event{Kind: trace.KindMalloc, Type: "MMAP", Device: "host", AllocID: 2, Size: 4096, Owner: "MMAP", CStack: "m x.c:3 (p)"})
	s.aid = 2
	s.malloc("PTA", "host", "b x.c:2 (p)", 64)
	r := s.report(nil)
	nt, no := len(r.Types), len(r.Owners)
	if nt != 3 || no != 3 {
		t.Fatalf("types %+v, owners %+v", r.Types, r.Owners)
	}
	idx := func(name string) int {
		for i, x := range r.Types {
			if x.Name == name {
				return i
			}
		}
		t.Fatalf("no type %s", name)
		return -1
	}
	for k, v := range r.Timeline.V {
		if len(v) != nt+no {
			t.Fatalf("point %d has %d values, want %d", k, len(v), nt+no)
		}
		var types, owners int64
		for i := range nt {
			types += v[i]
			owners += v[nt+i]
		}
		if types != owners {
			t.Errorf("point %d: types hold %d bytes, owners %d: %v", k, types, owners, v)
		}
	}
	first := r.Timeline.V[0]
	if first[idx("HOST")] != 1000 || first[idx("PTA")] != 0 || first[idx("MMAP")] != 0 {
		t.Errorf("first point %v (types %+v)", first, r.Types)
	}
}
