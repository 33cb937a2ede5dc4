package analyzer

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"msmemscope/analyzer/spec"
	"msmemscope/trace"
)

// ineffCapture plants one block of each kind of inefficiency, with the api
// ids worked out by hand in the comments (mem_size 100, idle_threshold 3).
func ineffCapture() (c *capBuilder, e, l, i uint64) {
	c = newCap()
	z := c.malloc("PTA", 10)  // api 1 (outside any operator); too small to judge
	c.malloc("HOST", 5000)    // HOST: no api, not judged
	c.opStart("aten::a")      // api 2
	e = c.malloc("PTA", 1000) // E: MALLOC in api 2
	c.opEnd("aten::a")
	c.free(z)              // api 3: a FREE between E's MALLOC (2) and first ACCESS (4)
	c.opStart("aten::b")   // api 4
	c.access(e, "aten::b") // E's first (and last) ACCESS: early_allocation
	c.opEnd("aten::b")
	c.opStart("aten::c") // api 5
	l = c.malloc("PTA", 2000)
	c.access(l, "aten::c") // L's last ACCESS: api 5
	c.opEnd("aten::c")
	c.opStart("aten::d")     // api 6
	m := c.malloc("PTA", 50) // a MALLOC in api 6, between L's last ACCESS (5) and its FREE (7)
	c.opEnd("aten::d")
	c.free(l)            // api 7: late_deallocation
	c.opStart("aten::e") // api 8
	i = c.malloc("PTA", 4096)
	c.access(i, "aten::e")
	c.opEnd("aten::e")
	for range 4 { // apis 9..12: I idle
		c.opStart("aten::f")
		c.opEnd("aten::f")
	}
	c.opStart("aten::g") // api 13: gap 13-8 = 5 > 3: temporary_idleness
	c.access(i, "aten::g")
	c.opEnd("aten::g")
	c.opStart("aten::h") // api 14: gap 1
	c.access(i, "aten::h")
	c.opEnd("aten::h")
	k := c.malloc("PTA", 8192) // api 15: never accessed: nothing to judge
	c.free(k)                  // api 16
	c.free(m)                  // api 17
	c.free(e)                  // api 18: E's last ACCESS 4 < MALLOC 15 < 18: late_deallocation too
	// I is never freed: judged at the end.
	return c, e, l, i
}

func ineffOf(t *testing.T, path string) map[uint64]string {
	t.Helper()
	in, err := trace.Open(path, trace.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	m := map[uint64]string{}
	for {
		e, err := in.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			return m
		}
		if e.Kind == trace.KindMalloc && e.Inefficient != "" {
			m[e.AllocID] = e.Inefficient
		}
	}
}

func TestCheckInefficientPlanted(t *testing.T) {
	c, e, l, i := ineffCapture()
	dir := t.TempDir()
	csvPath, dbPath := c.write(t, dir, "dump")
	var reports []*IneffReport
	for _, p := range []string{csvPath, dbPath} {
		// First run: early_allocation only.
		r, err := CheckInefficient(p, IneffOptions{MemSize: 100, IdleThreshold: 3, Types: []string{EarlyAllocation}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Added != 1 || len(r.Blocks) != 1 || r.Blocks[0].AllocID != e || r.Blocks[0].EarlySpan != 2 {
			t.Fatalf("%s: first run %+v", p, r)
		}
		if got := ineffOf(t, p); !reflect.DeepEqual(got, map[uint64]string{e: "early_allocation"}) {
			t.Fatalf("%s: after first run %v", p, got)
		}
		// Second run: every type. The first result stays, none is repeated.
		r, err = CheckInefficient(p, IneffOptions{MemSize: 100, IdleThreshold: 3}, nil)
		if err != nil {
			t.Fatal(err)
		}
		want := map[uint64]string{e: "early_allocation|late_deallocation", l: "late_deallocation", i: "temporary_idleness"}
		if got := ineffOf(t, p); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: after second run %v, want %v", p, got, want)
		}
		if r.Added != 3 || r.APIs != 18 || r.Judged != 4 {
			t.Fatalf("%s: second run added %d, apis %d, judged %d", p, r.Added, r.APIs, r.Judged)
		}
		wantTotals := map[string]IneffTotal{
			EarlyAllocation:   {Blocks: 1, Bytes: 1000, APISpan: 2},
			LateDeallocation:  {Blocks: 2, Bytes: 3000, APISpan: 14 + 2},
			TemporaryIdleness: {Blocks: 1, Bytes: 4096, APISpan: 5},
		}
		if !reflect.DeepEqual(r.Totals, wantTotals) {
			t.Fatalf("%s: totals %+v, want %+v", p, r.Totals, wantTotals)
		}
		// Third run: nothing new, the file is left alone.
		before, _ := os.ReadFile(p)
		r, err = CheckInefficient(p, IneffOptions{MemSize: 100, IdleThreshold: 3}, nil)
		if err != nil || r.Added != 0 || r.Written {
			t.Fatalf("%s: third run added %d (%v)", p, r.Added, err)
		}
		after, _ := os.ReadFile(p)
		if !bytes.Equal(before, after) {
			t.Fatalf("%s: third run changed the file", p)
		}
		if !strings.Contains(r.Summary(5), "every result was already in") {
			t.Fatalf("summary: %s", r.Summary(5))
		}
		r.Input = ""
		reports = append(reports, r)
	}
	if !reflect.DeepEqual(reports[0], reports[1]) {
		t.Fatalf("CSV and DB reports differ:\n%+v\n%+v", reports[0], reports[1])
	}
	// Both files now hold the same rows.
	a, b := readEvents(t, csvPath), readEvents(t, dbPath)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("CSV and DB rows differ after check_inefficient")
	}
	// A larger mem_size or threshold finds less.
	r, err := analyzeInefficient(csvPath, IneffOptions{MemSize: 2000, IdleThreshold: 5}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, b := range r.Blocks {
		got = append(got, b.AllocID)
	}
	if !reflect.DeepEqual(got, []uint64{l}) {
		t.Fatalf("mem_size 2000, idle 5: blocks %v, want [%d]", got, l)
	}
}

func readEvents(t *testing.T, p string) []trace.Event {
	in, err := trace.Open(p, trace.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var evs []trace.Event
	for {
		e, err := in.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			return evs
		}
		evs = append(evs, *e)
	}
}

func TestCheckInefficientBadInput(t *testing.T) {
	dir := t.TempDir()
	c, _, _, _ := ineffCapture()
	csvPath, _ := c.write(t, dir, "dump")
	data, _ := os.ReadFile(csvPath)
	// A truncated file: an error with the line, and the file untouched.
	trunc := csvPath + ".trunc.csv"
	cut := data[:len(data)-30]
	os.WriteFile(trunc, cut, 0o640)
	_, err := CheckInefficient(trunc, IneffOptions{IdleThreshold: 3}, nil)
	if err == nil || !strings.Contains(err.Error(), trunc+":") || !strings.Contains(err.Error(), "truncated last line") {
		t.Fatalf("truncated: %v", err)
	}
	if after, _ := os.ReadFile(trunc); !bytes.Equal(after, cut) {
		t.Fatal("a failed run changed the file")
	}
	if _, err := CheckInefficient(csvPath, IneffOptions{IdleThreshold: 3, Types: []string{"slow"}}, nil); err == nil {
		t.Fatal("unknown type accepted")
	}
	if _, err := CheckInefficient(dir, IneffOptions{IdleThreshold: 3}, nil); ErrorKind(err) != "IsADirectoryError" {
		t.Fatalf("directory: %v", err)
	}
}

func TestRunAnalyzerArgs(t *testing.T) {
	dir := t.TempDir()
	c, _, _, _ := ineffCapture()
	csvPath, _ := c.write(t, dir, "dump")
	for _, tc := range []struct {
		name   string
		kwargs map[string]any
		kind   string
	}{
		{"leaks", map[string]any{"input_path": csvPath, "mstx_info": "x"}, "TypeError"},
		{"leaks", map[string]any{"input_path": csvPath, "mstx_info": "x", "start_index": "0"}, "TypeError"},
		{"leaks", map[string]any{"input_path": csvPath, "mstx_info": " ", "start_index": 0}, "ValueError"},
		{"leaks", map[string]any{"input_path": csvPath, "mstx_info": "x", "start_index": -1}, "ValueError"},
		{"leaks", map[string]any{"input_path": csvPath, "mstx_info": "x", "start_index": 0, "bogus": 1}, "TypeError"},
		{"inefficient", map[string]any{"input_path": csvPath, "idle_threshold": 0}, "ValueError"},
		{"inefficient", map[string]any{"input_path": csvPath, "mem_size": -1}, "ValueError"},
		{"inefficient", map[string]any{"input_path": csvPath, "inefficient_type": []any{"early_allocation", 3}}, "TypeError"},
		{"inefficient", map[string]any{"input_path": csvPath, "inefficient_type": []any{}}, "ValueError"},
		{"inefficient", map[string]any{"input_path": csvPath, "inefficient_type": "late"}, "ValueError"},
		{"inefficient", map[string]any{"input_path": dir + "/none.csv"}, "FileNotFoundError"},
		{"nope", map[string]any{}, "ValueError"},
	} {
		_, err := RunAnalyzer(tc.name, tc.kwargs, nil)
		if err == nil || ErrorKind(err) != tc.kind {
			t.Errorf("%s %v: %v (%s), want %s", tc.name, tc.kwargs, err, ErrorKind(err), tc.kind)
		}
	}
	res, err := RunAnalyzer("inefficient", map[string]any{"input_path": csvPath, "mem_size": 100, "idle_threshold": 3, "inefficient_type": "temporary_idleness"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Value.(*IneffReport); r.Added != 1 || r.BlocksTotal != 1 {
		t.Fatalf("inefficient through RunAnalyzer: %+v", r)
	}
	if got := ListAnalyzers(); !reflect.DeepEqual(got, []string{"leaks", "inefficient"}) {
		t.Fatalf("ListAnalyzers = %v", got)
	}
	cfg, err := AnalyzerConfig("inefficient")
	if err != nil || cfg["idle_threshold"].Default != spec.DefaultIdleThreshold || cfg["mem_size"].Type != "int" || !cfg["input_path"].Required {
		t.Fatalf("AnalyzerConfig = %+v, %v", cfg, err)
	}
}

// Many inefficient blocks: every one is written to the file, the report
// lists the largest MaxIneffBlocks.
func TestCheckInefficientManyBlocks(t *testing.T) {
	c := newCap()
	n := MaxIneffBlocks + 500
	for i := 0; i < n; i++ {
		c.opStart("aten::a")
		b := c.malloc("PTA", uint64(1000+i))
		c.access(b, "aten::a")
		c.opEnd("aten::a")
		c.opStart("aten::b")
		s := c.malloc("PTA", 1)
		c.opEnd("aten::b")
		c.free(b) // late: a MALLOC (s) between its last access and its free
		c.free(s)
	}
	csvPath, _ := c.write(t, t.TempDir(), "dump")
	r, err := CheckInefficient(csvPath, IneffOptions{MemSize: 100, IdleThreshold: 3000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.BlocksTotal != n || r.Added != n || len(r.Blocks) != MaxIneffBlocks || r.Totals[LateDeallocation].Blocks != n {
		t.Fatalf("total %d, added %d, listed %d", r.BlocksTotal, r.Added, len(r.Blocks))
	}
	for i, b := range r.Blocks {
		if b.Size != uint64(1000+500+i) || !reflect.DeepEqual(b.Types, []string{LateDeallocation}) {
			t.Fatalf("block %d: %+v", i, b)
		}
	}
	if got := len(ineffOf(t, csvPath)); got != n {
		t.Fatalf("%d MALLOC rows marked, want %d", got, n)
	}
}

// ineffStream is a long capture in the manner of bench/offlinegen: blocks
// freed late, idle, allocated early, leaked, some with results already,
// operator names that need quoting.
func ineffStream(steps int) *capBuilder {
	c := newCap()
	type pending struct {
		a    uint64
		step int
	}
	var late, idle []pending
	var prev, early uint64
	for step := 0; step < steps; step++ {
		op := []string{"aten::add", `aten::"odd", op`}[step%2]
		c.opStart(op)
		out := c.malloc("PTA", 1000+uint64(step%7))
		c.access(out, op)
		if prev != 0 {
			c.access(prev, op)
		}
		if early != 0 {
			c.access(early, op)
			late = append(late, pending{early, step})
			early = 0
		}
		if len(idle) > 0 && step-idle[0].step >= 40 {
			c.access(idle[0].a, op)
			late = append(late, pending{idle[0].a, step})
			idle = idle[1:]
		}
		c.opEnd(op)
		switch {
		case prev == 0:
		case step%50 == 1: // a leak
		case step%10 == 1:
			late = append(late, pending{prev, step})
		case step%10 == 5:
			idle = append(idle, pending{prev, step})
		case step%13 == 7: // allocated, then a FREE, then accessed
			early = c.malloc("PTA", 4096)
			c.free(prev)
		default:
			c.free(prev)
		}
		for len(late) > 0 && step-late[0].step >= 3 {
			c.free(late[0].a)
			late = late[1:]
		}
		prev = out
	}
	for i := range c.evs {
		if e := &c.evs[i]; e.Kind == trace.KindMalloc && e.ID%9 == 0 {
			e.Inefficient = LateDeallocation
		}
	}
	return c
}

// CheckInefficient on a CSV writes the results while it reads the file,
// guessing which rows are final: the file must be the one the analysis
// followed by AddInefficient writes, whether the guesses hold or not.
func TestCheckInefficientWhileReading(t *testing.T) {
	defer func(l int64) { ineffLag = l }(ineffLag)
	dir := t.TempDir()
	src, _ := ineffStream(3000).write(t, dir, "src")
	orig, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	opt := IneffOptions{IdleThreshold: 30}
	ref := filepath.Join(dir, "ref.csv")
	os.WriteFile(ref, orig, 0o640)
	r, err := analyzeInefficient(ref, opt, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantN, err := trace.AddInefficient(ref, r.Marks(), nil)
	if err != nil || wantN == 0 {
		t.Fatalf("AddInefficient: %d, %v", wantN, err)
	}
	want, _ := os.ReadFile(ref)
	for _, lag := range []int64{1, 2000, 1 << 40} {
		ineffLag = lag
		p := filepath.Join(dir, "got.csv")
		os.WriteFile(p, orig, 0o640)
		r, err := CheckInefficient(p, opt, nil)
		if err != nil || r.Added != wantN || !r.Written {
			t.Fatalf("lag %d: added %d, %v; want %d", lag, r.Added, err, wantN)
		}
		if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
			t.Fatalf("lag %d: the file differs from AddInefficient's", lag)
		}
		if r, err := CheckInefficient(p, opt, nil); err != nil || r.Added != 0 {
			t.Fatalf("lag %d: second run added %d, %v", lag, r.Added, err)
		}
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".*")); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
}

// A MALLOC of a live allocation id ends the old block, even when the new one
// is too small to judge: the old one is judged once, not again at the FREE.
func TestInefficientMallocOfLiveID(t *testing.T) {
	c := newCap()
	c.opStart("aten::a")
	a := c.malloc("PTA", 1000)
	c.access(a, "aten::a")
	c.opEnd("aten::a")
	for range 5 {
		c.opStart("aten::b")
		c.opEnd("aten::b")
	}
	c.opStart("aten::c")
	c.access(a, "aten::c") // 6 apis later: temporary_idleness
	c.opEnd("aten::c")
	c.add(trace.Event{Kind: trace.KindMalloc, Type: "PTA", Device: "host", Ptr: 0x10000 * a, HasPtr: true, AllocID: a, Size: 10, Owner: "PTA"})
	c.free(a)
	csvPath, _ := c.write(t, t.TempDir(), "dump")
	r, err := CheckInefficient(csvPath, IneffOptions{MemSize: 100, IdleThreshold: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.BlocksTotal != 1 || r.Added != 1 || r.Totals[TemporaryIdleness].Blocks != 1 {
		t.Fatalf("found %d blocks, added %d, totals %+v; want the old block once", r.BlocksTotal, r.Added, r.Totals)
	}
}
