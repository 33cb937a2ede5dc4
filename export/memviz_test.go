package export

import (
	"bytes"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"msmemscope/trace"
)

func encodeViz(t *testing.T, ev []trace.Event) ([]byte, map[string]any) {
	t.Helper()
	m := newMemviz()
	for i := range ev {
		m.Observe(&ev[i])
	}
	return encodeWriter(t, m)
}

// encodeWriter encodes m's snapshot and reads it back.
func encodeWriter(t *testing.T, m *memvizWriter) ([]byte, map[string]any) {
	t.Helper()
	var b bytes.Buffer
	if err := m.Encode(&b); err != nil {
		t.Fatal(err)
	}
	v, err := unpickle(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), plain(v).(map[string]any)
}

func num(v any) uint64 {
	if b, ok := v.(*big.Int); ok {
		return b.Uint64()
	}
	return 1<<64 - 1
}

type vizSpan struct{ addr, size uint64 }

// checkViz checks what the viewer and torch.cuda._memory_viz rely on: each
// segment's blocks tile it in address order; each device's trace is in
// time order and balanced (a free follows an alloc at its address, a
// segment_free a segment_alloc), every alloc lies in a segment alive then,
// and replaying the trace ends with the snapshot's segments and blocks.
// It returns the device traces.
func checkViz(t *testing.T, d map[string]any) [][]map[string]any {
	t.Helper()
	endBlocks := map[uint64]map[uint64]uint64{} // device -> addr -> size
	endSegs := map[uint64]map[uint64]uint64{}
	for _, s := range d["segments"].([]any) {
		seg := s.(map[string]any)
		dev, addr, total := num(seg["device"]), num(seg["address"]), num(seg["total_size"])
		if endSegs[dev] == nil {
			endSegs[dev], endBlocks[dev] = map[uint64]uint64{}, map[uint64]uint64{}
		}
		endSegs[dev][addr] = total
		at, active := addr, uint64(0)
		for _, x := range seg["blocks"].([]any) {
			b := x.(map[string]any)
			if num(b["address"]) != at {
				t.Errorf("segment %#x: block at %#x, want %#x", addr, num(b["address"]), at)
			}
			if b["state"] == "active_allocated" {
				endBlocks[dev][at] = num(b["size"])
				active += num(b["size"])
				if num(b["requested_size"]) != num(b["size"]) {
					t.Errorf("block %#x: requested %d", at, num(b["requested_size"]))
				}
			} else if b["state"] != "inactive" {
				t.Errorf("block state %v", b["state"])
			}
			if _, ok := b["frames"].([]any); !ok {
				t.Errorf("block %#x: frames %T", at, b["frames"])
			}
			at += num(b["size"])
		}
		if at != addr+total || num(seg["allocated_size"]) != active || num(seg["active_size"]) != active {
			t.Errorf("segment %#x of %d: blocks end at +%d, allocated %d (active %d)", addr, total, at-addr,
				num(seg["allocated_size"]), active)
		}
		if p, ok := seg["segment_pool_id"].(pyTuple); !ok || len(p) != 2 {
			t.Errorf("segment_pool_id %v", seg["segment_pool_id"])
		}
	}
	var traces [][]map[string]any
	for dev, x := range d["device_traces"].([]any) {
		var tr []map[string]any
		blocks, segs := map[uint64]uint64{}, map[uint64]uint64{}
		last := uint64(0)
		inSeg := func(addr, size uint64) bool {
			for a, s := range segs {
				if a <= addr && addr+size <= a+s {
					return true
				}
			}
			return false
		}
		for _, y := range x.([]any) {
			e := y.(map[string]any)
			tr = append(tr, e)
			if tu := num(e["time_us"]); tu < last {
				t.Errorf("device %d: time goes back to %d after %d", dev, tu, last)
			} else {
				last = tu
			}
			if _, ok := e["frames"].([]any); !ok {
				t.Errorf("%v: frames %T", e["action"], e["frames"])
			}
			addr, size := num(e["addr"]), num(e["size"])
			switch e["action"] {
			case "alloc":
				if _, ok := blocks[addr]; ok || !inSeg(addr, size) {
					t.Errorf("device %d: alloc at %#x: already live %v, or in no segment", dev, addr, ok)
				}
				blocks[addr] = size
			case "free_requested":
				if blocks[addr] != size {
					t.Errorf("device %d: free_requested %#x of %d, live %d", dev, addr, size, blocks[addr])
				}
			case "free_completed":
				if blocks[addr] != size {
					t.Errorf("device %d: free_completed %#x of %d, live %d", dev, addr, size, blocks[addr])
				}
				delete(blocks, addr)
			case "segment_alloc":
				if _, ok := segs[addr]; ok {
					t.Errorf("device %d: segment_alloc at %#x twice", dev, addr)
				}
				segs[addr] = size
			case "segment_free":
				if segs[addr] != size {
					t.Errorf("device %d: segment_free %#x of %d, live %d", dev, addr, size, segs[addr])
				}
				for a := range blocks {
					if addr <= a && a < addr+size {
						t.Errorf("device %d: segment %#x freed with block %#x in it", dev, addr, a)
					}
				}
				delete(segs, addr)
			case "oom":
				if _, ok := e["device_free"]; !ok {
					t.Errorf("oom without device_free")
				}
			default:
				t.Errorf("action %v", e["action"])
			}
		}
		if !sameSpans(blocks, endBlocks[uint64(dev)]) || !sameSpans(segs, endSegs[uint64(dev)]) {
			t.Errorf("device %d: the trace ends with blocks %v, segments %v; the snapshot has %v, %v", dev,
				blocks, segs, endBlocks[uint64(dev)], endSegs[uint64(dev)])
		}
		traces = append(traces, tr)
	}
	return traces
}

func sameSpans(a, b map[uint64]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func actions(tr []map[string]any) string {
	var s []string
	for _, e := range tr {
		s = append(s, e["action"].(string))
	}
	return strings.Join(s, " ")
}

const segBase = 0x7f0000000000

// A CUDA device's segment with PTA blocks in it, a CUDA block outside any
// segment, host blocks, a block and a segment allocated before the
// capture and freed in it, an OOM; rows memory_viz ignores.
func vizEvents() []trace.Event {
	pta := func(k trace.Kind, ns uint64, dev string, id, ptr, size uint64, py, c string) trace.Event {
		return trace.Event{Kind: k, Type: trace.TypePTA, Timestamp: ns, Device: dev, AllocID: id, Ptr: ptr,
			HasPtr: true, Size: size, Owner: "PTA@model@weight", PyStack: py, CStack: c}
	}
	hal := func(k trace.Kind, ns uint64, id, ptr, size uint64, kind string) trace.Event {
		return trace.Event{Kind: k, Type: trace.TypeHAL, Timestamp: ns, Device: "0", AllocID: id, Ptr: ptr,
			HasPtr: true, Size: size, Extra: []trace.KV{{Key: "kind", Value: kind}, {Key: "stream", Value: "0x10"}}}
	}
	return []trace.Event{
		hal(trace.KindMalloc, 1000, 100, segBase, 4<<20, "device"),
		pta(trace.KindMalloc, 2000, "0", 1, segBase, 1<<20, "train.py:10(step);main.py:3(<module>)", ""),
		pta(trace.KindMalloc, 3000, "0", 2, segBase+2<<20, 512<<10, "train.py:11(step)", ""),
		pta(trace.KindMalloc, 4000, "host", 3, 0x5000, 4096, "cpu.py:7(make)", ""),
		pta(trace.KindFree, 5000, "host", 99, 0x9000, 8192, "cpu.py:9(drop)", ""), // allocated before the capture
		pta(trace.KindFree, 6000, "0", 1, segBase, 1<<20, "", ""),
		pta(trace.KindMalloc, 7000, "host", 4, 0x6000, 100, "", "alloc_fn lib.c:12 (libx.so)"),
		pta(trace.KindFree, 8000, "host", 4, 0x6000, 100, "", ""),
		hal(trace.KindFree, 8500, 98, 0x7e0000000000, 2<<20, "device"), // a segment from before the capture
		hal(trace.KindMalloc, 8600, 97, 0x1234, 1<<20, "vmm"),          // a handle: no segment
		{Kind: trace.KindSnapshot, Type: trace.NA, Timestamp: 8700, Device: "0", Extra: []trace.KV{{Key: "free", Value: "12345"}}},
		{Kind: trace.KindOOM, Type: trace.TypeHAL, Timestamp: 9000, Device: "0", Size: 1 << 30},
		pta(trace.KindMalloc, 9500, "0", 5, segBase+64<<20, 2048, "", ""), // in no known segment
		{Kind: trace.KindMalloc, Type: trace.TypeHost, Timestamp: 9600, Device: "host", AllocID: 6, Ptr: 0x8000, Size: 64},
	}
}

func TestMemvizSnapshot(t *testing.T) {
	_, d := encodeViz(t, vizEvents())
	traces := checkViz(t, d)
	if len(traces) != 2 {
		t.Fatalf("%d device traces, want 2 (CUDA 0, then host)", len(traces))
	}
	want0 := "segment_alloc segment_alloc alloc alloc free_requested free_completed segment_free oom segment_alloc alloc"
	want1 := "segment_alloc alloc segment_alloc alloc free_requested free_completed segment_free " +
		"segment_alloc alloc free_requested free_completed segment_free"
	if got := actions(traces[0]); got != want0 {
		t.Errorf("device 0: %s\nwant %s", got, want0)
	}
	if got := actions(traces[1]); got != want1 {
		t.Errorf("host: %s\nwant %s", got, want1)
	}
	// The segment from before the capture comes first, at the first time kept.
	if e := traces[0][0]; num(e["addr"]) != 0x7e0000000000 || num(e["time_us"]) != 1 {
		t.Errorf("head %v", e)
	}
	// So does the host block freed before its alloc was seen.
	if e := traces[1][1]; num(e["addr"]) != 0x9000 || num(e["size"]) != 8192 {
		t.Errorf("host head %v", e)
	}
	a := traces[0][2] // block 1's alloc
	fr := a["frames"].([]any)
	if len(fr) != 2 || fr[0].(map[string]any)["filename"] != "train.py" || num(fr[0].(map[string]any)["line"]) != 10 ||
		fr[0].(map[string]any)["name"] != "step" || fr[1].(map[string]any)["name"] != "<module>" {
		t.Errorf("frames %v", fr)
	}
	if num(a["stream"]) != 0x10 || num(a["time_us"]) != 2 || num(a["size"]) != 1<<20 {
		t.Errorf("alloc %v", a)
	}
	if c := traces[1][8]["frames"].([]any); len(c) != 1 || c[0].(map[string]any)["name"] != "alloc_fn" ||
		c[0].(map[string]any)["filename"] != "lib.c" || num(c[0].(map[string]any)["line"]) != 12 {
		t.Errorf("C frames %v", c)
	}
	if o := traces[0][7]; num(o["size"]) != 1<<30 || num(o["device_free"]) != 12345 {
		t.Errorf("oom %v", o)
	}
	segs := d["segments"].([]any)
	if len(segs) != 3 {
		t.Fatalf("%d segments, want 3", len(segs))
	}
	s0 := segs[0].(map[string]any)
	var states []string
	for _, b := range s0["blocks"].([]any) {
		states = append(states, b.(map[string]any)["state"].(string))
	}
	if num(s0["address"]) != segBase || num(s0["total_size"]) != 4<<20 || num(s0["stream"]) != 0x10 ||
		strings.Join(states, " ") != "inactive active_allocated inactive" || num(s0["allocated_size"]) != 512<<10 {
		t.Errorf("segment %v", s0)
	}
	if s := segs[1].(map[string]any); num(s["device"]) != 0 || num(s["address"]) != segBase+64<<20 || num(s["total_size"]) != 2048 {
		t.Errorf("own CUDA segment %v", s)
	}
	if s := segs[2].(map[string]any); num(s["device"]) != 1 || num(s["address"]) != 0x5000 || num(s["total_size"]) != 4096 ||
		s["segment_type"] != "small" {
		t.Errorf("host segment %v", s)
	}
}

// Host blocks alone: the host is device 0.
func TestMemvizHostOnly(t *testing.T) {
	ev := []trace.Event{{Kind: trace.KindMalloc, Type: trace.TypePTA, Device: "host", AllocID: 1, Ptr: 0x1000, Size: 10, Timestamp: 5}}
	_, d := encodeViz(t, ev)
	if tr := checkViz(t, d); len(tr) != 1 || actions(tr[0]) != "segment_alloc alloc" {
		t.Errorf("traces %v", tr)
	}
	_, d = encodeViz(t, nil)
	if tr := d["device_traces"].([]any); len(tr) != 1 || len(d["segments"].([]any)) != 0 {
		t.Errorf("empty capture: %v", d)
	}
}

// Past memvizMaxEntries the newest entries stay, still balanced: the blocks
// alive when they begin get their allocs at the start.
func TestMemvizKeepsTheNewest(t *testing.T) {
	defer func(n int) { memvizMaxEntries = n }(memvizMaxEntries)
	memvizMaxEntries = 6
	var ev []trace.Event
	for i := uint64(1); i <= 20; i++ {
		ev = append(ev, trace.Event{Kind: trace.KindMalloc, Type: trace.TypePTA, Device: "host", AllocID: i,
			Ptr: 0x1000 * i, Size: i, Timestamp: 1000 * i, PyStack: "a.py:1(f)"})
		if i%2 == 0 { // frees the previous block
			ev = append(ev, trace.Event{Kind: trace.KindFree, Type: trace.TypePTA, Device: "host", AllocID: i - 1,
				Ptr: 0x1000 * (i - 1), Size: i - 1, Timestamp: 1000*i + 1})
		}
	}
	m := newMemviz()
	for i := range ev {
		m.Observe(&ev[i])
	}
	if len(m.ring) != 6 || len(m.stacks.ids) != 1 {
		t.Fatalf("%d entries kept, %d stacks", len(m.ring), len(m.stacks.ids))
	}
	_, snap := encodeWriter(t, m)
	tr := checkViz(t, snap)
	// Kept: alloc 17, alloc 18, free 17, alloc 19, alloc 20, free 19; at
	// their start, the allocs of the blocks alive at the end whose allocs
	// fell out (2, 4, ... 16).
	var allocs []string
	for _, e := range tr[0] {
		if e["action"] == "alloc" {
			allocs = append(allocs, strconv.FormatUint(num(e["size"]), 10))
		}
	}
	if got := strings.Join(allocs, " "); got != "2 4 6 8 10 12 14 16 17 18 19 20" {
		t.Errorf("allocs of blocks %s", got)
	}
}

// torch.cuda._memory_viz reads it: trace, segsum, segments and memory.
func TestMemvizReadByTorch(t *testing.T) {
	py := python(t)
	if err := exec.Command(py, "-c", "import torch.cuda._memory_viz").Run(); err != nil {
		t.Skip("no torch")
	}
	b, _ := encodeViz(t, vizEvents())
	f := filepath.Join(t.TempDir(), "memory_viz.pickle")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `import pickle, sys
from torch.cuda import _memory_viz as mv
d = pickle.load(open(sys.argv[1], "rb"))
out = mv.trace(d)
assert "Device 0" in out and "Device 1" in out and "raise OutOfMemoryError" in out, out
s = mv.segsum(d)
assert "segments: 3" in s, s
flat = mv.segments(d, format_flamegraph=lambda x: x)
assert "train.py:11:step" in flat, flat
mv.memory(d, format_flamegraph=lambda x: x)
mv.filter_alloc_free_pairs(d)
print("ok")`
	out, err := exec.Command(py, "-c", script, f).CombinedOutput()
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
		t.Fatalf("%v: %s", err, out)
	}
}

// A snapshot with nothing in it says so (a C program's host heap has no
// place in PyTorch's viewer).
func TestMemvizNoteWhenEmpty(t *testing.T) {
	m := newMemviz()
	m.Observe(&trace.Event{Kind: trace.KindMalloc, Type: trace.TypeHost, Device: trace.DeviceHost, AllocID: 1, Size: 64, Ptr: 0x1000, HasPtr: true})
	if m.Note() == "" {
		t.Error("no note for a snapshot of host blocks only")
	}
	m.Observe(&trace.Event{Kind: trace.KindMalloc, Type: trace.TypePTA, Device: trace.DeviceHost, AllocID: 2, Size: 64, Ptr: 0x2000, HasPtr: true})
	if n := m.Note(); n != "" {
		t.Errorf("a note for a snapshot with a tensor block: %q", n)
	}
}
