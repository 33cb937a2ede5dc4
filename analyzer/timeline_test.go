package analyzer

import (
	"bytes"
	"strings"
	"testing"

	"msmemscope/trace"
)

type sliceStream struct {
	ev []trace.Event
	i  int
}

func (s *sliceStream) Next() (*trace.Event, error) {
	if s.i >= len(s.ev) {
		return nil, nil
	}
	s.i++
	return &s.ev[s.i-1], nil
}

const mib = 1 << 20

// A program whose site grow.c:10 gains 1 MiB every 200 ms while a 2 MiB block
// from buf.c:5 is freed at 550 ms.
func plantedEvents() []trace.Event {
	ms := func(t uint64) uint64 { return 1_000_000_000 + t*1_000_000 }
	grow := "grow_step grow.c:10 (prog);main grow.c:30 (prog)"
	var ev []trace.Event
	ev = append(ev, trace.Event{Kind: trace.KindMalloc, Type: "HOST", Timestamp: ms(0), AllocID: 1, Size: 2 * mib, CStack: "make_buf buf.c:5 (prog)"})
	id := uint64(2)
	for t := uint64(0); t <= 800; t += 200 {
		ev = append(ev, trace.Event{Kind: trace.KindMalloc, Type: "HOST", Timestamp: ms(t) + 1, AllocID: id, Size: mib, CStack: grow})
		id++
		if t == 400 {
			ev = append(ev, trace.Event{Kind: trace.KindFree, Type: "HOST", Timestamp: ms(550), AllocID: 1, Size: 2 * mib})
		}
	}
	return ev
}

func TestTimelineMatchesPlantedPattern(t *testing.T) {
	ev := plantedEvents()
	tl, err := BuildTimeline(&sliceStream{ev: ev}, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]uint64{{0, 3 * mib}, {100, 3 * mib}, {200, 4 * mib}, {300, 4 * mib}, {400, 5 * mib},
		{500, 5 * mib}, {600, 4 * mib}, {700, 4 * mib}, {800, 5 * mib}}
	got := tl.Sizes()
	if len(got) != len(want) {
		t.Fatalf("got %d intervals %v, want %d", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("interval %d: got %v, want %v", i, got[i], want[i])
		}
	}
	peak, _ := tl.Peak()
	if peak.Ms != 400 || peak.MaxLive != 5*mib {
		t.Errorf("peak %+v", peak)
	}
	r, err := tl.ReportAt(&sliceStream{ev: ev}, 450)
	if err != nil {
		t.Fatal(err)
	}
	if r.TotalSize != 5*mib || len(r.Report) != 2 {
		t.Fatalf("report at 450 ms: %+v", r)
	}
	if r.Report[0] != (SiteSize{Site: "grow.c:10", Function: "grow_step", Size: 3 * mib, Count: 3}) ||
		r.Report[1] != (SiteSize{Site: "buf.c:5", Function: "make_buf", Size: 2 * mib, Count: 1}) {
		t.Errorf("report at 450 ms: %+v", r.Report)
	}
	// After the free the buf.c site is gone; the report sums to the total.
	r, _ = tl.ReportAt(&sliceStream{ev: ev}, 650)
	var sum uint64
	for _, s := range r.Report {
		sum += s.Size
	}
	if r.TotalSize != 4*mib || sum != r.TotalSize || len(r.Report) != 1 {
		t.Errorf("report at 650 ms: %+v", r)
	}
	if _, err := tl.ReportAt(&sliceStream{ev: ev}, 5000); err == nil {
		t.Error("a time past the end was accepted")
	}
	var out bytes.Buffer
	WriteTimeline(&out, tl, r, 600)
	if !strings.Contains(out.String(), "grow.c:10") || !strings.Contains(out.String(), "       800         5242880") {
		t.Errorf("printed timeline:\n%s", out.String())
	}
}

func TestSiteOf(t *testing.T) {
	cases := []struct {
		e        trace.Event
		site, fn string
	}{
		{trace.Event{PyStack: "train.py:12(step);main.py:3(<module>)", CStack: "f a.c:1 (x)"}, "train.py:12", "step"},
		{trace.Event{CStack: "leak data.c:41 (train);main train.c:88 (train)"}, "data.c:41", "leak"},
		{trace.Event{CStack: "leak (libfoo.so+0x1a2b)"}, "libfoo.so+0x1a2b", "leak"},
		{trace.Event{CStack: "0x7f00deadbeef"}, "0x7f00deadbeef", ""},
		// demangled C++ names hold spaces and parentheses
		{trace.Event{CStack: "operator new(unsigned long) (libstdc++.so.6+0xa958c)"}, "libstdc++.so.6+0xa958c", "operator new(unsigned long)"},
		{trace.Event{CStack: "std::map<int, int>::at(int const&) map.h:12 (prog);main m.cc:3 (prog)"}, "map.h:12", "std::map<int, int>::at(int const&)"},
		{trace.Event{Site: "zoo::leak_here(int) zoo.cc:7 (zoo)"}, "zoo.cc:7", "zoo::leak_here(int)"},
		{trace.Event{CStack: "?? (libfoo.so+0x10)"}, "libfoo.so+0x10", "??"},
		{trace.Event{}, "(unknown)", ""},
	}
	for _, c := range cases {
		s, f := SiteOf(&c.e)
		if s != c.site || f != c.fn {
			t.Errorf("SiteOf(%q|%q) = %q,%q; want %q,%q", c.e.PyStack, c.e.CStack, s, f, c.site, c.fn)
		}
	}
}
