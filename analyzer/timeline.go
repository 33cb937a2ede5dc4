package analyzer

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"msmemscope/trace"
)

// The peak timeline and per-site reports (SPEC §7): live bytes per allocation
// site, and the local maximum of live bytes in each interval of a capture.

// SiteSize is one line of a memory report: live bytes allocated at a site.
type SiteSize struct {
	Site     string `json:"site"`     // "file:line", or "module+0xoffset" without debug info
	Function string `json:"function"` // "" when unknown
	Size     uint64 `json:"size"`
	Count    int    `json:"count"`
}

// MemReport is get_mem_report's result: live bytes per site, largest first,
// summing to TotalSize.
type MemReport struct {
	TotalSize uint64     `json:"total_size"`
	Report    []SiteSize `json:"mem_report"`
}

// SiteOf names the allocation site of a MALLOC: the innermost Python frame
// when there is a Python stack, else the innermost C frame.
func SiteOf(e *trace.Event) (site, function string) {
	if e.PyStack != "" {
		f := firstFrame(e.PyStack)
		// Python frames are "file:line(function)".
		if i := strings.LastIndexByte(f, '('); i > 0 && strings.HasSuffix(f, ")") {
			return f[:i], f[i+1 : len(f)-1]
		}
		return f, ""
	}
	if e.CStack != "" {
		return cFrameSite(firstFrame(e.CStack))
	}
	if e.Site != "" {
		return cFrameSite(e.Site)
	}
	return UnknownSite, ""
}

// UnknownSite is the site of a MALLOC with no stack and no caller known.
const UnknownSite = "(unknown)"

// cFrameSite splits a C frame, "function file:line (module)" or
// "function (module+0xoff)", into site and function. A demangled C++ name
// may hold spaces and parentheses ("operator new(unsigned long)",
// "std::map<int, int>::at(int const&)"): the module is the last
// parenthesized part, and file:line the word before it.
func cFrameSite(f string) (site, function string) {
	i := strings.LastIndex(f, " (")
	if i < 0 || !strings.HasSuffix(f, ")") {
		return f, ""
	}
	head, module := f[:i], f[i+2:len(f)-1]
	if j := strings.LastIndexByte(head, ' '); j >= 0 && isFileLine(head[j+1:]) {
		return head[j+1:], head[:j]
	}
	return module, head
}

// isFileLine reports whether w reads "file:line".
func isFileLine(w string) bool {
	i := strings.LastIndexByte(w, ':')
	if i <= 0 || i == len(w)-1 || strings.ContainsAny(w, "()<>,") {
		return false
	}
	for _, c := range w[i+1:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func firstFrame(stack string) string {
	f, _, _ := strings.Cut(stack, ";")
	return f
}

type siteKey struct{ site, fn string }

type liveBlock struct {
	size uint64
	site siteKey
}

// LiveSet tracks live blocks and live bytes per site over an event stream.
type LiveSet struct {
	blocks map[uint64]liveBlock // by allocation id
	sites  map[siteKey]*SiteSize
	Total  uint64
}

// NewLiveSet returns an empty live set.
func NewLiveSet() *LiveSet {
	return &LiveSet{blocks: map[uint64]liveBlock{}, sites: map[siteKey]*SiteSize{}}
}

// Observe applies a MALLOC or FREE; other events are ignored.
func (l *LiveSet) Observe(e *trace.Event) {
	switch e.Kind {
	case trace.KindMalloc:
		site, fn := SiteOf(e)
		k := siteKey{site, fn}
		if old, ok := l.blocks[e.AllocID]; ok { // a MALLOC seen twice: replace
			l.remove(old)
		}
		l.blocks[e.AllocID] = liveBlock{e.Size, k}
		s := l.sites[k]
		if s == nil {
			s = &SiteSize{Site: site, Function: fn}
			l.sites[k] = s
		}
		s.Size += e.Size
		s.Count++
		l.Total += e.Size
	case trace.KindFree:
		if b, ok := l.blocks[e.AllocID]; ok {
			delete(l.blocks, e.AllocID)
			l.remove(b)
		}
	}
}

func (l *LiveSet) remove(b liveBlock) {
	l.Total -= b.size
	if s := l.sites[b.site]; s != nil {
		s.Size -= b.size
		s.Count--
		if s.Count == 0 {
			delete(l.sites, b.site)
		}
	}
}

// Report returns the live bytes per site, largest first.
func (l *LiveSet) Report() MemReport {
	r := MemReport{TotalSize: l.Total, Report: make([]SiteSize, 0, len(l.sites))}
	for _, s := range l.sites {
		r.Report = append(r.Report, *s)
	}
	sortSites(r.Report)
	return r
}

// ReportOf is the report of sites named apart that may share a name (two
// instructions of one line): one line per site and function, largest
// first.
func ReportOf(sites []SiteSize) MemReport {
	var r MemReport
	at := map[siteKey]int{}
	for _, s := range sites {
		r.TotalSize += s.Size
		k := siteKey{s.Site, s.Function}
		if i, ok := at[k]; ok {
			r.Report[i].Size += s.Size
			r.Report[i].Count += s.Count
			continue
		}
		at[k] = len(r.Report)
		r.Report = append(r.Report, s)
	}
	if r.Report == nil {
		r.Report = []SiteSize{}
	}
	sortSites(r.Report)
	return r
}

func sortSites(r []SiteSize) {
	sort.Slice(r, func(i, j int) bool {
		a, b := r[i], r[j]
		if a.Size != b.Size {
			return a.Size > b.Size
		}
		if a.Site != b.Site {
			return a.Site < b.Site
		}
		return a.Function < b.Function
	})
}

// TimePoint is one interval of the timeline: its start (ms from the start of
// the first interval, which is aligned to a multiple of the interval on the
// monotonic clock) and the largest live byte count reached inside it.
type TimePoint struct {
	Ms      uint64
	MaxLive uint64
	atEvent uint64 // stream position (1-based) where the maximum was reached; 0: carried over
}

// Timeline is get_all_time_size's result plus what it takes to rebuild the
// report at each interval's maximum.
type Timeline struct {
	IntervalMs uint64
	StartNs    uint64
	Points     []TimePoint
}

// BuildTimeline reads a whole stream and returns the local maximum of live
// bytes in each interval. Memory grows with live blocks, not stream length.
func BuildTimeline(s trace.Stream, intervalMs uint64) (*Timeline, error) {
	if intervalMs == 0 {
		return nil, fmt.Errorf("interval must be at least 1 ms")
	}
	tl := &Timeline{IntervalMs: intervalMs}
	live := NewLiveSet()
	step := intervalMs * 1e6
	var pos uint64
	started := false
	err := trace.Each(s, func(e *trace.Event) error {
		pos++
		if !started {
			started = true
			// Intervals are aligned to the clock (multiples of the interval),
			// so timelines of separately parsed logs line up.
			tl.StartNs = e.Timestamp / step * step
			tl.Points = append(tl.Points, TimePoint{Ms: 0})
		}
		var idx uint64
		if e.Timestamp > tl.StartNs {
			idx = (e.Timestamp - tl.StartNs) / step
		}
		for uint64(len(tl.Points)) <= idx {
			// A new interval starts with what is live when it begins.
			tl.Points = append(tl.Points, TimePoint{Ms: uint64(len(tl.Points)) * intervalMs, MaxLive: live.Total, atEvent: pos - 1})
		}
		live.Observe(e)
		p := &tl.Points[len(tl.Points)-1]
		if live.Total > p.MaxLive || p.atEvent == 0 && live.Total == p.MaxLive {
			p.MaxLive, p.atEvent = live.Total, pos
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return tl, nil
}

// Sizes returns [[t_ms, max_live_bytes], …].
func (tl *Timeline) Sizes() [][2]uint64 {
	out := make([][2]uint64, len(tl.Points))
	for i, p := range tl.Points {
		out[i] = [2]uint64{p.Ms, p.MaxLive}
	}
	return out
}

// Peak returns the interval with the largest maximum (the first, on ties).
func (tl *Timeline) Peak() (TimePoint, bool) {
	var best TimePoint
	found := false
	for _, p := range tl.Points {
		if !found || p.MaxLive > best.MaxLive {
			best, found = p, true
		}
	}
	return best, found
}

// ReportAt rebuilds the per-site report at the maximum of the interval that
// holds tMs, by replaying a fresh stream of the same capture up to it.
func (tl *Timeline) ReportAt(s trace.Stream, tMs uint64) (MemReport, error) {
	if len(tl.Points) == 0 {
		return MemReport{}, fmt.Errorf("the capture holds no events")
	}
	i := tMs / tl.IntervalMs
	if i >= uint64(len(tl.Points)) {
		return MemReport{}, fmt.Errorf("%d ms is past the end of the capture (%d ms)", tMs, uint64(len(tl.Points))*tl.IntervalMs)
	}
	stop := tl.Points[i].atEvent
	live := NewLiveSet()
	for pos := uint64(1); pos <= stop; pos++ {
		e, err := s.Next()
		if err != nil {
			return MemReport{}, err
		}
		if e == nil {
			break
		}
		live.Observe(e)
	}
	return live.Report(), nil
}

// WriteTimeline prints the timeline and the report at its peak, as
// `msmemscope --timeline` does.
func WriteTimeline(w io.Writer, tl *Timeline, peak MemReport, peakMs uint64) {
	fmt.Fprintf(w, "peak timeline (local maximum of live bytes every %d ms)\n", tl.IntervalMs)
	fmt.Fprintf(w, "%10s  %14s\n", "t_ms", "max_live_bytes")
	for _, p := range tl.Points {
		fmt.Fprintf(w, "%10d  %14d\n", p.Ms, p.MaxLive)
	}
	fmt.Fprintf(w, "\nlive bytes per site at the peak (interval starting at %d ms): total %d\n", peakMs, peak.TotalSize)
	for _, s := range peak.Report {
		fn := s.Function
		if fn == "" {
			fn = "-"
		}
		fmt.Fprintf(w, "%14d  %6d blocks  %s  %s\n", s.Size, s.Count, s.Site, fn)
	}
}
