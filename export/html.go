package export

import (
	"io"
	"sort"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/internal/intern"
	"msmemscope/trace"
)

// html: one self-contained report a person opens from disk (html_report.go
// renders it). The writer aggregates as events pass; nothing grows with the
// number of events but the live blocks, the sites (one per Event Type and
// call stack) and a bounded number of timeline points and moments.
//
// Memory has two views that must not be added together: the memory itself
// (HOST, MMAP, HAL, HOST_PINNED, and PTA blocks on the CPU, which are the
// host heap's blocks retyped) and the framework's blocks inside it (PTA and
// PTA_WORKSPACE on a CUDA device lie in HAL memory the caching allocator
// holds). Each view has its own total, peak and per-site figures at its
// peak; a device's PTA blocks are their own series, "PTA (device 0)".
type htmlWriter struct {
	pid     int64
	command []string

	siteIDs []map[string]int32 // per type: call stack -> index in sites
	sites   []htmlSite

	types     intern.Table // Event Type series
	typeView  []uint8      // by type: viewMemory or viewFramework
	owners    intern.Table
	ownerType []uint16 // by owner: the Event Type of its first block

	live  map[uint64]htmlBlock // by allocation id
	views [2]htmlView          // viewMemory, viewFramework

	firstNs, lastNs uint64
	events, mallocs uint64 // MALLOC and FREE events; MALLOCs
	timeline        pointTrack
	moments         momentTrack

	// Steps: by step() calls (their ends) or by mstx ranges "step start";
	// which one is known at the end (SPEC §3).
	callEnds   []uint64
	rangeSteps []htmlSpan
	openSteps  map[uint64]int // MstxID -> index in rangeSteps
	openRanges map[uint64]htmlSpan
	ranges     []htmlSpan // other mstx ranges
	marks      []htmlSpan
	ooms       []htmlOOM

	lastMalloc uint64 // heaptrack's temporary allocation: freed before any other allocation
	kindOf     func(uint64) (string, bool)
	reports    *Analyses
	report     *ProcReport          // made once, at the end
	ineff      map[string]*IneffRow // from the rows' inefficient attribute
}

const (
	viewMemory    = 0
	viewFramework = 1

	maxTimeline   = 1500
	maxMoments    = 200
	momentSites   = 25
	maxSpans      = 2000
	maxFlameSites = 5000
	maxTableSites = 100
	maxOwners     = 24
)

// Analyses are the run's analysis results a report shows beside its own
// figures (nil fields: that analysis did not run).
type Analyses struct {
	Leaks       *analyzer.LeakReport
	Inefficient *analyzer.IneffReport
	Decompose   *analyzer.DecomposeReport
}

type htmlSite struct {
	stack        string
	typ          uint16
	allocN       int64
	allocB       int64
	tempN        int64
	liveN, liveB int64
}

type htmlBlock struct {
	site         int32
	owner        uint16
	typ          uint16
	stepR, stepC int32 // its step by mstx ranges, and by step() calls
	size         int64
}

type htmlView struct {
	total, peak int64
	peakNs      uint64
	sites       peakVec
	types       peakVec
	owners      peakVec
}

// peakVec is a vector of live bytes with its value at the view's peak. A
// new peak copies only the entries changed since the last one.
type peakVec struct {
	cur, atPeak []int64
	dirty       []int32
	isDirty     []bool
}

func (v *peakVec) add(i int32, d int64) {
	for int(i) >= len(v.cur) {
		v.cur, v.atPeak, v.isDirty = append(v.cur, 0), append(v.atPeak, 0), append(v.isDirty, false)
	}
	v.cur[i] += d
	if !v.isDirty[i] {
		v.isDirty[i] = true
		v.dirty = append(v.dirty, i)
	}
}

func (v *peakVec) mark() {
	for _, i := range v.dirty {
		v.atPeak[i] = v.cur[i]
		v.isDirty[i] = false
	}
	v.dirty = v.dirty[:0]
}

// curOf is entry i now (0 for one never changed: a type whose blocks so
// far were all 0 bytes).
func (v *peakVec) curOf(i int) int64 {
	if i < len(v.cur) {
		return v.cur[i]
	}
	return 0
}

func (v *peakVec) peakOf(i int) int64 {
	if i < len(v.atPeak) {
		return v.atPeak[i]
	}
	return 0
}

type htmlSpan struct {
	Name string `json:"name"`
	T0   uint64 `json:"t0"`
	T1   uint64 `json:"t1"` // 0: not ended in the capture
	Tid  int64  `json:"tid,omitempty"`
}

type htmlOOM struct {
	T      uint64 `json:"t"`
	Device string `json:"device"`
	API    string `json:"api"`
	Size   string `json:"size"`
}

// pointTrack is the timeline: per time bucket the moment its memory total
// was highest, with every type's and owner's live bytes then. Buckets double
// in width when there are too many.
type pointTrack struct {
	width  uint64
	points []htmlPoint
	ntypes func() int // how many types are known now
}

// layout gives a point's values in the report's layout, every type then
// every owner (n of each known at the end): a type or owner seen first
// after the point was taken is 0 there.
func (q *htmlPoint) layout(types, owners int) []int64 {
	out := make([]int64, types+owners)
	copy(out, q.vals[:q.ntypes])
	copy(out[types:], q.vals[q.ntypes:])
	return out
}

type htmlPoint struct {
	bucket uint64
	ns     uint64
	key    int64
	vals   []int64 // types, then owners: those known when it was taken (ntypes types)
	ntypes int
}

func (p *pointTrack) add(ns uint64, key int64, vals func(dst []int64) []int64) {
	b := ns / p.width
	if n := len(p.points); n > 0 && p.points[n-1].bucket == b {
		if q := &p.points[n-1]; key > q.key {
			q.ns, q.key, q.vals = ns, key, vals(q.vals[:0]) // reuses the slice
			q.ntypes = p.ntypes()
		}
		return
	}
	p.points = append(p.points, htmlPoint{b, ns, key, vals(nil), p.ntypes()})
	for len(p.points) > maxTimeline {
		p.width *= 2
		out := p.points[:0]
		for _, q := range p.points {
			q.bucket /= 2
			if n := len(out); n > 0 && out[n-1].bucket == q.bucket {
				if q.key > out[n-1].key {
					out[n-1] = q
				}
				continue
			}
			out = append(out, q)
		}
		p.points = out
	}
}

// momentTrack keeps the live bytes of the largest sites at regular moments,
// for the per-site report at a moment chosen on the timeline.
type momentTrack struct {
	width  uint64
	bucket uint64
	list   []htmlMoment
}

type htmlMoment struct {
	T     uint64     `json:"t"`
	Sites [][2]int64 `json:"sites"` // site index (report's), live bytes
	site  []int32
	bytes []int64
}

func newHTML() *htmlWriter {
	h := &htmlWriter{live: map[uint64]htmlBlock{}, openSteps: map[uint64]int{}, openRanges: map[uint64]htmlSpan{},
		timeline: pointTrack{width: 1000}, moments: momentTrack{width: 1_000_000}, ineff: map[string]*IneffRow{}}
	h.timeline.ntypes = h.types.Len
	return h
}

func (h *htmlWriter) Name() (string, string)                          { return "report_", ".html" }
func (h *htmlWriter) SetProcess(pid int64)                            { h.pid = pid }
func (h *htmlWriter) SetCommand(cmd []string)                         { h.command = cmd }
func (h *htmlWriter) SetLeakKinds(kindOf func(uint64) (string, bool)) { h.kindOf = kindOf }
func (h *htmlWriter) SetAnalyses(a *Analyses)                         { h.reports = a }
func isFramework(series string) bool                                  { return strings.Contains(series, deviceSuffix) }
func (h *htmlWriter) viewOf(typ uint16) *htmlView                     { return &h.views[h.viewIndex(typ)] }
func (h *htmlWriter) viewIndex(typ uint16) int                        { return int(h.typeView[typ]) }

func (h *htmlWriter) typeID(t string) uint16 {
	i := h.types.ID(t)
	if int(i) == len(h.typeView) { // new: its view, once
		v := uint8(viewMemory)
		if isFramework(t) {
			v = viewFramework
		}
		h.typeView = append(h.typeView, v)
	}
	return uint16(i)
}

func (h *htmlWriter) ownerID(o string, typ uint16) uint16 {
	if o == "" {
		o = h.types.Name(int32(typ))
	}
	if i, ok := h.owners.Lookup(o); ok {
		return uint16(i)
	}
	if h.owners.Len() >= maxOwners { // the rest share one series
		o = "(other owners)"
		if i, ok := h.owners.Lookup(o); ok {
			return uint16(i)
		}
	}
	h.ownerType = append(h.ownerType, typ)
	return uint16(h.owners.ID(o))
}

func (h *htmlWriter) siteID(typ uint16, stack string) int32 {
	for int(typ) >= len(h.siteIDs) {
		h.siteIDs = append(h.siteIDs, map[string]int32{})
	}
	if i, ok := h.siteIDs[typ][stack]; ok {
		return i
	}
	i := int32(len(h.sites))
	h.siteIDs[typ][stack] = i
	h.sites = append(h.sites, htmlSite{stack: stack, typ: typ})
	return i
}

func (h *htmlWriter) Observe(e *trace.Event) {
	if e.Kind == trace.KindMalloc || e.Kind == trace.KindFree {
		h.events++ // the same whether a reader skipped the kinds the report does not show or not
	}
	if h.pid == 0 {
		h.pid = e.Pid // a dump read offline: its rows name it
	}
	if e.Timestamp != 0 {
		if h.firstNs == 0 || e.Timestamp < h.firstNs {
			h.firstNs = e.Timestamp
		}
		h.lastNs = max(h.lastNs, e.Timestamp)
	}
	switch e.Kind {
	case trace.KindMalloc:
		h.malloc(e)
	case trace.KindFree:
		h.free(e)
	case trace.KindSystem:
		if e.Type == trace.TypeStep {
			h.callEnds = append(h.callEnds, e.Timestamp)
		}
	case trace.KindMstx:
		h.mstx(e)
	case trace.KindOOM:
		if len(h.ooms) < maxSpans {
			size, _ := e.Get("size")
			h.ooms = append(h.ooms, htmlOOM{e.Timestamp, e.Device, e.Name, size})
		}
	}
}

// deviceSuffix marks the series of a framework's blocks on a device.
const deviceSuffix = " (device "

// series names the Event Type series of a block: a device's PTA blocks
// apart from the CPU's.
func series(e *trace.Event) string {
	if strings.HasPrefix(e.Type, "PTA") && e.Device != "" && e.Device != trace.DeviceHost {
		return e.Type + deviceSuffix + e.Device + ")"
	}
	return e.Type
}

func (h *htmlWriter) malloc(e *trace.Event) {
	if old, ok := h.live[e.AllocID]; ok { // a MALLOC seen again replaces its block
		h.drop(old)
	}
	h.mallocs++
	typ := h.typeID(series(e))
	b := htmlBlock{site: h.siteID(typ, stackOf(e)), typ: typ, size: int64(e.Size),
		stepR: int32(h.rangeStep()), stepC: int32(len(h.callEnds) + 1)}
	b.owner = h.ownerID(e.Owner, typ)
	if e.Inefficient != "" {
		h.addIneff(e)
	}
	s := &h.sites[b.site]
	s.allocN++
	s.allocB += b.size
	s.liveN++
	s.liveB += b.size
	h.live[e.AllocID] = b
	v := h.viewOf(typ)
	h.lastMalloc = e.AllocID
	h.change(v, b, b.size, e.Timestamp)
	if v.total > v.peak {
		v.peak, v.peakNs = v.total, e.Timestamp
		v.sites.mark()
		v.types.mark()
		v.owners.mark()
	}
}

func (h *htmlWriter) free(e *trace.Event) {
	b, ok := h.live[e.AllocID]
	if !ok {
		return // allocated before the capture
	}
	delete(h.live, e.AllocID)
	v := h.viewOf(b.typ)
	if h.lastMalloc == e.AllocID {
		h.sites[b.site].tempN++
	}
	h.lastMalloc = 0
	h.drop(b)
	h.change(v, b, 0, e.Timestamp)
}

// drop takes a block out of its site's live figures and its view's.
func (h *htmlWriter) drop(b htmlBlock) {
	s := &h.sites[b.site]
	s.liveN--
	s.liveB -= b.size
	v := h.viewOf(b.typ)
	v.total -= b.size
	v.sites.add(b.site, -b.size)
	v.types.add(int32(b.typ), -b.size)
	v.owners.add(int32(b.owner), -b.size)
}

// change applies d bytes of b to its view, then records the timeline.
func (h *htmlWriter) change(v *htmlView, b htmlBlock, d int64, ns uint64) {
	if d != 0 {
		v.total += d
		v.sites.add(b.site, d)
		v.types.add(int32(b.typ), d)
		v.owners.add(int32(b.owner), d)
	}
	if mb := ns / h.moments.width; mb != h.moments.bucket || len(h.moments.list) == 0 {
		h.moments.bucket = mb
		h.takeMoment(ns)
	}
	key := h.views[viewMemory].total
	if key == 0 {
		key = h.views[viewFramework].total
	}
	h.timeline.add(ns, key, h.pointVals)
}

func (h *htmlWriter) pointVals(out []int64) []int64 {
	for i := range h.types.Len() {
		out = append(out, h.viewOf(uint16(i)).types.curOf(i))
	}
	for i, typ := range h.ownerType {
		out = append(out, h.viewOf(typ).owners.curOf(i))
	}
	return out
}

// takeMoment keeps the largest sites' live bytes now; past maxMoments every
// other moment goes and the spacing doubles.
func (h *htmlWriter) takeMoment(ns uint64) {
	m := htmlMoment{T: ns}
	idx := make([]int32, 0, momentSites+1)
	for i := range h.sites {
		if h.sites[i].liveB <= 0 {
			continue
		}
		if len(idx) == momentSites && h.sites[i].liveB <= h.sites[idx[len(idx)-1]].liveB {
			continue
		}
		j := sort.Search(len(idx), func(k int) bool { return h.sites[idx[k]].liveB < h.sites[i].liveB })
		idx = append(idx, 0)
		copy(idx[j+1:], idx[j:])
		idx[j] = int32(i)
		if len(idx) > momentSites {
			idx = idx[:momentSites]
		}
	}
	for _, i := range idx {
		m.site = append(m.site, i)
		m.bytes = append(m.bytes, h.sites[i].liveB)
	}
	h.moments.list = append(h.moments.list, m)
	if len(h.moments.list) > maxMoments {
		out := h.moments.list[:0]
		for i, x := range h.moments.list {
			if i%2 == 0 || i == len(h.moments.list)-1 {
				out = append(out, x)
			}
		}
		h.moments.list = out
		h.moments.width *= 2
		h.moments.bucket = ns / h.moments.width
	}
}

func (h *htmlWriter) rangeStep() int {
	best := 0
	for _, i := range h.openSteps { // the most recently opened (SPEC §3)
		best = max(best, i+1)
	}
	return best
}

func (h *htmlWriter) mstx(e *trace.Event) {
	switch e.Type {
	case trace.TypeMark:
		if len(h.marks) < maxSpans {
			h.marks = append(h.marks, htmlSpan{Name: e.Name, T0: e.Timestamp, Tid: e.Tid})
		}
	case trace.TypeRangeStart:
		if e.Name == trace.StepRangeMessage {
			h.openSteps[e.MstxID] = len(h.rangeSteps)
			h.rangeSteps = append(h.rangeSteps, htmlSpan{Name: "step", T0: e.Timestamp})
			return
		}
		h.openRanges[e.MstxID] = htmlSpan{Name: e.Name, T0: e.Timestamp, Tid: e.Tid}
	case trace.TypeRangeEnd:
		if i, ok := h.openSteps[e.MstxID]; ok {
			h.rangeSteps[i].T1 = e.Timestamp
			delete(h.openSteps, e.MstxID)
			return
		}
		if r, ok := h.openRanges[e.MstxID]; ok {
			delete(h.openRanges, e.MstxID)
			r.T1 = e.Timestamp
			if len(h.ranges) < maxSpans {
				h.ranges = append(h.ranges, r)
			}
		}
	}
}

// IneffRow is one line of the report's inefficient blocks: a site's blocks
// of one inefficiency.
type IneffRow struct {
	Type   string `json:"type"`
	Kinds  string `json:"inefficient"`
	Stack  string `json:"stack"`
	Blocks int64  `json:"blocks"`
	Bytes  int64  `json:"bytes"`
}

func (h *htmlWriter) addIneff(e *trace.Event) {
	key := e.Type + "\x00" + e.Inefficient + "\x00" + stackOf(e)
	r := h.ineff[key]
	if r == nil {
		r = &IneffRow{Type: e.Type, Kinds: e.Inefficient, Stack: stackOf(e)}
		h.ineff[key] = r
	}
	r.Blocks++
	r.Bytes += int64(e.Size)
}

func (h *htmlWriter) Encode(w io.Writer) error {
	return writeHTML(w, []*ProcReport{h.Report()}, nil)
}
