package export

import (
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
	events []map[string]any // everything but the counters, in stream order
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
	if e.Pid == 0 && p.pid != 0 {
		c := *e
		c.Pid = p.pid
		e = &c
	}
	p.pids[e.Pid] = true
	p.lastNs = max(p.lastNs, e.Timestamp)
	base := func(ph, name string) map[string]any {
		return map[string]any{"ph": ph, "name": name, "ts": us(e.Timestamp), "pid": e.Pid, "tid": e.Tid}
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
		ev["s"] = "t"
		ev["cat"] = "kernel"
		args := map[string]any{"device": e.Device}
		for _, kv := range e.Extra {
			args[kv.Key] = kv.Value
		}
		ev["args"] = args
		p.events = append(p.events, ev)
	case trace.KindMstx:
		switch e.Type {
		case trace.TypeMark:
			ev := base("i", e.Name)
			ev["s"] = "t"
			ev["cat"] = "mstx"
			p.events = append(p.events, ev)
		case trace.TypeRangeStart:
			ev := base("b", e.Name)
			ev["cat"], ev["id"] = "mstx", strconv.FormatUint(e.MstxID, 10)
			p.open[e.MstxID] = e.Name
			p.events = append(p.events, ev)
		case trace.TypeRangeEnd:
			name, ok := p.open[e.MstxID]
			if !ok {
				return // a range started before the capture: no begin to end
			}
			delete(p.open, e.MstxID)
			ev := base("e", name)
			ev["cat"], ev["id"] = "mstx", strconv.FormatUint(e.MstxID, 10)
			p.events = append(p.events, ev)
		}
	case trace.KindSystem:
		if e.Type == trace.TypeStep {
			p.stepOf[e.Pid]++
			ev := base("i", "step "+strconv.Itoa(p.stepOf[e.Pid])+" ends")
			ev["s"] = "p"
			ev["cat"] = "step"
			p.events = append(p.events, ev)
		}
	case trace.KindOOM:
		ev := base("i", "OOM")
		ev["s"] = "p"
		size, _ := e.Get("size")
		ev["args"] = map[string]any{"device": e.Device, "requested": size}
		p.events = append(p.events, ev)
	}
}

func (p *perfettoWriter) Encode(w io.Writer) error {
	var out []map[string]any
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
		out = append(out, map[string]any{"ph": "M", "name": "process_name", "pid": id, "tid": 0,
			"args": map[string]any{"name": "msmemscope: process " + strconv.FormatInt(id, 10)}})
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
			out = append(out, map[string]any{"ph": "C", "name": c.name, "ts": us(pt.bucket * c.width), "pid": pid, "args": args})
		}
	}
	// Operator slices left open (a capture cut short) end with the capture.
	depth := map[[2]int64][]string{}
	for _, ev := range p.events {
		k := [2]int64{ev["pid"].(int64), ev["tid"].(int64)}
		switch ev["ph"] {
		case "B":
			depth[k] = append(depth[k], ev["name"].(string))
		case "E":
			if n := len(depth[k]); n > 0 {
				depth[k] = depth[k][:n-1]
			}
		}
	}
	out = append(out, p.events...)
	for k, names := range depth {
		for i := len(names) - 1; i >= 0; i-- {
			out = append(out, map[string]any{"ph": "E", "name": names[i], "ts": us(p.lastNs), "pid": k[0], "tid": k[1]})
		}
	}
	for id, name := range p.open {
		out = append(out, map[string]any{"ph": "e", "name": name, "cat": "mstx", "id": strconv.FormatUint(id, 10),
			"ts": us(p.lastNs), "pid": pid, "tid": 0})
	}
	enc := json.NewEncoder(w)
	return enc.Encode(map[string]any{"traceEvents": out, "displayTimeUnit": "ms",
		"otherData": map[string]any{"producer": "msmemscope"}})
}
