package export

import (
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/google/pprof/profile"

	"msmemscope/trace"
)

// pprof: a heap profile as Go's (sample types alloc_objects, alloc_space,
// inuse_objects, inuse_space; inuse_space first shown), one sample per call
// stack, device, owner and step of allocation, labelled with those three.
// The stack is the Python one when there is one, else the C one, else the
// allocation site, else "(no stack)" (--call-stack gives the flame graphs).
// The blocks in use at the end carry their leak kind too when the scan at
// exit ran (label leak: definitely_lost...; -tagfocus=leak=definitely_lost).
type pprofWriter struct {
	index   map[sampleKey]int
	samples []*pprofSample
	live    map[uint64]liveRef // by allocation id
	kindOf  func(uint64) (string, bool)
}

type sampleKey struct {
	stack, device, owner string
	step                 int
	leak                 string // in-use samples only: the block's leak kind
}

func (p *pprofWriter) SetLeakKinds(kindOf func(uint64) (string, bool)) { p.kindOf = kindOf }

func (p *pprofWriter) sample(k sampleKey) *pprofSample {
	i, ok := p.index[k]
	if !ok {
		i = len(p.samples)
		p.index[k] = i
		p.samples = append(p.samples, &pprofSample{key: k})
	}
	return p.samples[i]
}

type pprofSample struct {
	key                            sampleKey
	allocN, allocB, inuseN, inuseB int64
}

type liveRef struct {
	key  sampleKey
	size uint64
}

func newPprof() *pprofWriter {
	return &pprofWriter{index: map[sampleKey]int{}, live: map[uint64]liveRef{}}
}

func (p *pprofWriter) Name() (string, string) { return "profile_", ".pb.gz" }

func stackOf(e *trace.Event) string {
	if s := eventStack(e); s != "" {
		return s
	}
	return "(no stack)"
}

// eventStack is an event's stack: the Python one, else the C one, else its
// allocation site as a single frame; "" when it has none.
func eventStack(e *trace.Event) string {
	switch {
	case e.PyStack != "":
		return e.PyStack
	case e.CStack != "":
		return e.CStack
	}
	return e.Site
}

func (p *pprofWriter) Observe(e *trace.Event) {
	switch e.Kind {
	case trace.KindMalloc:
		k := sampleKey{stack: stackOf(e), device: e.Device, owner: e.Owner, step: e.Step}
		s := p.sample(k)
		s.allocN++
		s.allocB += int64(e.Size)
		p.live[e.AllocID] = liveRef{k, e.Size} // a MALLOC seen again replaces its block
	case trace.KindFree:
		delete(p.live, e.AllocID)
	}
}

// A Python frame "file:line(function)"; a C frame "function file:line
// (module)" or "function (module+0xoffset)".
var (
	pyFrame = regexp.MustCompile(`^(.*):(\d+)\((.*)\)$`)
	cFrame  = regexp.MustCompile(`^(.*) (\S+):(\d+) \(([^()]*)\)$`)
	cNoLine = regexp.MustCompile(`^(.*) \(([^()]*)\)$`)
)

func frameFunc(f string) (name, file string, line int64) {
	if m := pyFrame.FindStringSubmatch(f); m != nil && !strings.Contains(m[1], " (") {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		return m[3], m[1], n
	}
	if m := cFrame.FindStringSubmatch(f); m != nil {
		n, _ := strconv.ParseInt(m[3], 10, 64)
		return m[1], m[2], n
	}
	if m := cNoLine.FindStringSubmatch(f); m != nil && m[1] != "??" {
		mod, _, _ := strings.Cut(m[2], "+")
		return m[1], mod, 0
	}
	return f, "", 0
}

func (p *pprofWriter) Encode(w io.Writer) error {
	for id, l := range p.live {
		k := l.key
		if p.kindOf != nil {
			k.leak, _ = p.kindOf(id)
		}
		s := p.sample(k)
		s.inuseN++
		s.inuseB += int64(l.size)
	}
	prof := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "alloc_objects", Unit: "count"}, {Type: "alloc_space", Unit: "bytes"},
			{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"}},
		DefaultSampleType: "inuse_space",
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		Period:            1,
	}
	funcs := map[string]*profile.Function{}
	locs := map[string]*profile.Location{}
	location := func(frame string) *profile.Location {
		if l := locs[frame]; l != nil {
			return l
		}
		name, file, line := frameFunc(frame)
		fk := name + "\x00" + file
		fn := funcs[fk]
		if fn == nil {
			fn = &profile.Function{ID: uint64(len(prof.Function) + 1), Name: name, SystemName: name, Filename: file}
			funcs[fk] = fn
			prof.Function = append(prof.Function, fn)
		}
		l := &profile.Location{ID: uint64(len(prof.Location) + 1), Line: []profile.Line{{Function: fn, Line: line}}}
		locs[frame] = l
		prof.Location = append(prof.Location, l)
		return l
	}
	// The same capture gives the same file: samples in a fixed order.
	sort.Slice(p.samples, func(i, j int) bool {
		a, b := p.samples[i].key, p.samples[j].key
		if a.stack != b.stack {
			return a.stack < b.stack
		}
		if a.device != b.device {
			return a.device < b.device
		}
		if a.owner != b.owner {
			return a.owner < b.owner
		}
		if a.step != b.step {
			return a.step < b.step
		}
		return a.leak < b.leak
	})
	p.index = nil // positions moved: Encode ends the writer's life
	for _, s := range p.samples {
		var ls []*profile.Location
		for _, f := range strings.Split(s.key.stack, ";") { // innermost first, as pprof's
			ls = append(ls, location(f))
		}
		labels := map[string][]string{"step": {strconv.Itoa(s.key.step)}}
		if s.key.device != "" {
			labels["device"] = []string{s.key.device}
		}
		if s.key.owner != "" {
			labels["owner"] = []string{s.key.owner}
		}
		if s.key.leak != "" {
			labels["leak"] = []string{s.key.leak}
		}
		prof.Sample = append(prof.Sample, &profile.Sample{Location: ls,
			Value: []int64{s.allocN, s.allocB, s.inuseN, s.inuseB}, Label: labels})
	}
	if err := prof.CheckValid(); err != nil {
		return err
	}
	return prof.Write(w)
}
