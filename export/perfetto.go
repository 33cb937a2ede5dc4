package export

import (
	"bufio"
	"encoding/json"
	"io"
	"sort"
	"strconv"

	"msmemscope/trace"
)

// perfetto: the capture as a trace in the Chrome JSON trace format, which
// ui.perfetto.dev (and chrome://tracing) opens: counter tracks of the live
// bytes per Event Type and per owner, operator launches as slices of their
// thread, kernel launches and mstx marks as instants, mstx ranges as async
// slices (a range may end on another thread), steps as process instants.
// Counters keep at most maxPoints samples: past that the time buckets
// double and each keeps its largest value, so peaks stay visible.
type perfettoWriter struct {
	events []traceEvent // everything but the counters, in stream order
	pids   map[int64]bool

	live   map[uint64]liveBlock // by allocation id
	byType map[string]int64
	byOwn  map[string]int64
	types  *counterTrack
	owners *counterTrack
	lastNs uint64
	stepOf map[int64]int // the last step seen per process
	open   map[uint64]string
	pid    int64 // the process, for rows that carry none (a conversion's)
}

func (p *perfettoWriter) SetProcess(pid int64) { p.pid = pid }

// traceEvent is one event of the trace format (a struct, not a map: a
// capture holds millions of launches).
type traceEvent struct {
	Ph   string         `json:"ph"`
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	ID   string         `json:"id,omitempty"`
	S    string         `json:"s,omitempty"` // an instant's scope: t(hread) or p(rocess)
	Ts   float64        `json:"ts"`
	Pid  int64          `json:"pid"`
	Tid  int64          `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

type liveBlock struct {
	typ, owner string
	size       int64
}

const maxPoints = 50000

// counterTrack is one counter's samples, bucketed.
type counterTrack struct {
	name   string
	width  uint64 // ns per bucket
	points []counterPoint
}

type counterPoint struct {
	bucket uint64
	vals   map[string]int64
}

func (c *counterTrack) add(ns uint64, vals map[string]int64) {
	b := ns / c.width
	if n := len(c.points); n > 0 && c.points[n-1].bucket == b {
		p := &c.points[n-1]
		for k, v := range vals {
			p.vals[k] = max(p.vals[k], v)
		}
		return
	}
	cp := make(map[string]int64, len(vals))
	for k, v := range vals {
		cp[k] = v
	}
	c.points = append(c.points, counterPoint{b, cp})
	for len(c.points) > maxPoints {
		c.compact()
	}
}

func (c *counterTrack) compact() {
	c.width *= 2
	out := c.points[:0]
	for _, p := range c.points {
		p.bucket /= 2
		if n := len(out); n > 0 && out[n-1].bucket == p.bucket {
			for k, v := range p.vals {
				out[n-1].vals[k] = max(out[n-1].vals[k], v)
			}
			continue
		}
		out = append(out, p)
	}
	c.points = out
}

func newPerfetto() *perfettoWriter {
	return &perfettoWriter{pids: map[int64]bool{}, live: map[uint64]liveBlock{}, byType: map[string]int64{},
		byOwn: map[string]int64{}, types: &counterTrack{name: "live bytes by type", width: 1000},
		owners: &counterTrack{name: "live bytes by owner", width: 1000}, stepOf: map[int64]int{}, open: map[uint64]string{}}
}

func (p *perfettoWriter) Name() (string, string) { return "trace_", ".perfetto.json" }

func us(ns uint64) float64 { return float64(ns) / 1000 }

func (p *perfettoWriter) Observe(e *trace.Event) {
	pid := e.Pid
	if pid == 0 {
		pid = p.pid // a conversion's rows carry none
	}
	p.pids[pid] = true
	p.lastNs = max(p.lastNs, e.Timestamp)
	base := func(ph, name string) traceEvent {
		return traceEvent{Ph: ph, Name: name, Ts: us(e.Timestamp), Pid: pid, Tid: e.Tid}
	}
	switch e.Kind {
	case trace.KindMalloc, trace.KindFree:
		if e.Kind == trace.KindMalloc {
			if old, ok := p.live[e.AllocID]; ok { // a MALLOC seen twice replaces its block
				p.byType[old.typ] -= old.size
				p.byOwn[old.owner] -= old.size
			}
			b := liveBlock{e.Type, e.Owner, int64(e.Size)}
			p.live[e.AllocID] = b
			p.byType[b.typ] += b.size
			p.byOwn[b.owner] += b.size
		} else if b, ok := p.live[e.AllocID]; ok {
			delete(p.live, e.AllocID)
			p.byType[b.typ] -= b.size
			p.byOwn[b.owner] -= b.size
		}
		p.types.add(e.Timestamp, p.byType)
		p.owners.add(e.Timestamp, p.byOwn)
	case trace.KindOpLaunch:
		switch e.Type {
		case trace.TypeAtenStart:
			p.events = append(p.events, base("B", e.Name))
		case trace.TypeAtenEnd:
			p.events = append(p.events, base("E", e.Name))
		}
	case trace.KindKernelLaunch:
		ev := base("i", e.Name)
		ev.S, ev.Cat = "t", "kernel"
		ev.Args = map[string]any{"device": e.Device}
		for _, kv := range e.Extra {
			ev.Args[kv.Key] = kv.Value
		}
		p.events = append(p.events, ev)
	case trace.KindMstx:
		switch e.Type {
		case trace.TypeMark:
			ev := base("i", e.Name)
			ev.S, ev.Cat = "t", "mstx"
			p.events = append(p.events, ev)
		case trace.TypeRangeStart:
			ev := base("b", e.Name)
			ev.Cat, ev.ID = "mstx", strconv.FormatUint(e.MstxID, 10)
			p.open[e.MstxID] = e.Name
			p.events = append(p.events, ev)
		case trace.TypeRangeEnd:
			name, ok := p.open[e.MstxID]
			if !ok {
				return // a range started before the capture: no begin to end
			}
			delete(p.open, e.MstxID)
			ev := base("e", name)
			ev.Cat, ev.ID = "mstx", strconv.FormatUint(e.MstxID, 10)
			p.events = append(p.events, ev)
		}
	case trace.KindSystem:
		if e.Type == trace.TypeStep {
			p.stepOf[pid]++
			ev := base("i", "step "+strconv.Itoa(p.stepOf[pid])+" ends")
			ev.S, ev.Cat = "p", "step"
			p.events = append(p.events, ev)
		}
	case trace.KindOOM:
		ev := base("i", "OOM")
		ev.S = "p"
		size, _ := e.Get("size")
		ev.Args = map[string]any{"device": e.Device, "requested": size}
		p.events = append(p.events, ev)
	}
}

// Encode writes the trace event by event (the whole trace is never built
// as one value).
func (p *perfettoWriter) Encode(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	first := true
	put := func(ev traceEvent) error {
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if !first {
			bw.WriteByte(',')
		}
		first = false
		_, err = bw.Write(b)
		return err
	}
	bw.WriteString(`{"traceEvents":[`)
	pids := make([]int64, 0, len(p.pids))
	for pid := range p.pids {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	pid := int64(0)
	if len(pids) > 0 {
		pid = pids[0]
	}
	for _, id := range pids {
		if err := put(traceEvent{Ph: "M", Name: "process_name", Pid: id,
			Args: map[string]any{"name": "msmemscope: process " + strconv.FormatInt(id, 10)}}); err != nil {
			return err
		}
	}
	for _, c := range []*counterTrack{p.types, p.owners} {
		for _, pt := range c.points {
			args := map[string]any{}
			for k, v := range pt.vals {
				if k == "" {
					k = "N/A"
				}
				args[k] = v
			}
			if err := put(traceEvent{Ph: "C", Name: c.name, Ts: us(pt.bucket * c.width), Pid: pid, Args: args}); err != nil {
				return err
			}
		}
	}
	// Operator slices left open (a capture cut short) end with the capture.
	depth := map[[2]int64][]string{}
	for _, ev := range p.events {
		k := [2]int64{ev.Pid, ev.Tid}
		switch ev.Ph {
		case "B":
			depth[k] = append(depth[k], ev.Name)
		case "E":
			if n := len(depth[k]); n > 0 {
				depth[k] = depth[k][:n-1]
			}
		}
		if err := put(ev); err != nil {
			return err
		}
	}
	for k, names := range depth {
		for i := len(names) - 1; i >= 0; i-- {
			if err := put(traceEvent{Ph: "E", Name: names[i], Ts: us(p.lastNs), Pid: k[0], Tid: k[1]}); err != nil {
				return err
			}
		}
	}
	for id, name := range p.open {
		if err := put(traceEvent{Ph: "e", Name: name, Cat: "mstx", ID: strconv.FormatUint(id, 10), Ts: us(p.lastNs), Pid: pid}); err != nil {
			return err
		}
	}
	bw.WriteString(`],"displayTimeUnit":"ms","otherData":{"producer":"msmemscope"}}` + "\n")
	return bw.Flush()
}
