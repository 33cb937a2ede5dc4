package main

import (
	"bufio"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"msmemscope/trace"
)

// steps writes a capture of one training step as CSV (and DB): each
// operator allocates a 4096-byte output; extra[i] more bytes in operator i;
// insert names an operator run after the first one. The operators from
// the fourth on are step 1 (an mstx step range).
func steps(t *testing.T, path string, extra map[int]uint64, insert string) {
	t.Helper()
	var evs []trace.Event
	aid := uint64(0)
	add := func(e trace.Event) {
		e.ID = uint64(len(evs) + 1)
		e.Timestamp = 1000 + e.ID
		e.Pid, e.Tid = 7, 7
		evs = append(evs, e)
	}
	malloc := func(size uint64) {
		aid++
		add(trace.Event{Kind: trace.KindMalloc, Type: "PTA", Device: "host", Ptr: aid * 0x1000, HasPtr: true, AllocID: aid, Size: size})
	}
	op := func(name string, sizes ...uint64) {
		add(trace.Event{Kind: trace.KindOpLaunch, Type: "ATEN_START", Name: name, Device: "host"})
		for _, s := range sizes {
			if s > 0 {
				malloc(s)
			}
		}
		add(trace.Event{Kind: trace.KindOpLaunch, Type: "ATEN_END", Name: name, Device: "host"})
	}
	add(trace.Event{Kind: trace.KindSystem, Type: trace.TypeStart})
	for i, name := range []string{"aten::linear", "aten::relu", "aten::linear", "aten::relu", "aten::softmax"} {
		if i == 3 {
			add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeRangeStart, Name: trace.StepRangeMessage, MstxID: 1})
		}
		op(name, 4096, extra[i])
		if i == 0 && insert != "" {
			op(insert, 64)
		}
	}
	if strings.HasSuffix(path, ".db") {
		w, err := trace.CreateSQLite(path)
		if err != nil {
			t.Fatal(err)
		}
		for i := range evs {
			w.Write(&evs[i])
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	os.MkdirAll(filepath.Dir(path), 0o750)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	bw := bufio.NewWriter(f)
	w := trace.NewCSVWriter(bw)
	for i := range evs {
		w.Write(&evs[i])
	}
	w.Flush()
	bw.Flush()
	f.Close()
}

const wantCompare = "Event,Name,Device Id,Base Allocated Memory(byte),Compare Allocated Memory(byte),Diff Memory(byte),Base Index,Compare Index,Base Step,Compare Step\n" +
	"OP_LAUNCH,aten::relu,host,4096,12288,8192,4,5,1,1\n" +
	"OP_LAUNCH,aten::dropout,host,N/A,64,64,N/A,2,N/A,0\n" +
	"OP_LAUNCH,aten::linear,host,4096,4096,0,1,1,0,0\n" +
	"OP_LAUNCH,aten::relu,host,4096,4096,0,2,3,0,0\n" +
	"OP_LAUNCH,aten::linear,host,4096,4096,0,3,4,0,0\n" +
	"OP_LAUNCH,aten::softmax,host,4096,4096,0,5,6,1,1\n"

func compareOutput(t *testing.T, out string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(out, "compare", "memory_compare_*.csv"))
	if len(m) != 1 {
		t.Fatalf("compare outputs: %v", m)
	}
	b, _ := os.ReadFile(m[0])
	os.Remove(m[0])
	return string(b)
}

func TestCompareCLI(t *testing.T) {
	dir := t.TempDir()
	// Files, CSV and DB mixed.
	base := filepath.Join(dir, "base.csv")
	cmpDB := filepath.Join(dir, "cmp.db")
	steps(t, base, nil, "")
	steps(t, cmpDB, map[int]uint64{3: 8192}, "aten::dropout")
	out := filepath.Join(dir, "out")
	if rc := run([]string{"--compare", "--input=" + base + "," + cmpDB, "--output=" + out}); rc != 0 {
		t.Fatalf("compare files: exit %d", rc)
	}
	if got := compareOutput(t, out); got != wantCompare {
		t.Fatalf("compare files:\n%s", got)
	}
	// Capture folders (their dump files), and an output folder holding one.
	capA := filepath.Join(dir, "a", "msmemscope_1_20260101000000")
	capB := filepath.Join(dir, "b", "msmemscope_2_20260101000000")
	steps(t, filepath.Join(capA, "dump", "memscope_dump_20260101000000.csv"), nil, "")
	steps(t, filepath.Join(capB, "dump", "memscope_dump_20260101000000.csv"), map[int]uint64{3: 8192}, "aten::dropout")
	if rc := run([]string{"--compare", "--input=" + capA + "，" + filepath.Join(dir, "b"), "--output=" + out}); rc != 0 {
		t.Fatalf("compare folders: exit %d", rc)
	}
	if got := compareOutput(t, out); got != wantCompare {
		t.Fatalf("compare folders:\n%s", got)
	}
	// --export=html: the comparison as a page, its rows inlined.
	if rc := run([]string{"--compare", "--input=" + capA + "," + capB, "--output=" + out, "--export=html"}); rc != 0 {
		t.Fatalf("compare --export=html: exit %d", rc)
	}
	pages, _ := filepath.Glob(filepath.Join(out, "export", "report_*.html"))
	if len(pages) != 1 {
		t.Fatalf("compare reports: %v", pages)
	}
	b, _ := os.ReadFile(pages[0])
	if !strings.Contains(string(b), `"name":"aten::relu","device":"host","base":4096,"compare":12288,"diff":8192`) ||
		!strings.Contains(string(b), `"base_index":4,"compare_index":5,"base_step":1,"compare_step":1`) {
		t.Errorf("the compare report does not hold the planted difference:\n%.3000s", b)
	}
}

func TestCompareCLIBadInput(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.csv")
	steps(t, good, nil, "")
	bad := filepath.Join(dir, "bad.csv")
	b, _ := os.ReadFile(good)
	os.WriteFile(bad, []byte(strings.Replace(string(b), "size:4096", "size:4k", 1)), 0o640)
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o750)
	out := filepath.Join(dir, "out")
	for _, in := range []string{good + "," + filepath.Join(dir, "none.csv"), good + "," + bad, good + "," + empty} {
		if rc := run([]string{"--compare", "--input=" + in, "--output=" + out}); rc != 2 {
			t.Errorf("--input=%s: exit %d, want 2", in, rc)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(out, "compare", "*")); len(m) != 0 {
		t.Fatalf("outputs written for bad inputs: %v", m)
	}
	after, _ := os.ReadFile(good)
	if string(after) != string(b) {
		t.Fatal("input changed")
	}
}

func TestOfflineFileCLI(t *testing.T) {
	dir := t.TempDir()
	capDir := filepath.Join(dir, "msmemscope_1_20260101000000")
	dump := filepath.Join(capDir, "dump", "memscope_dump_20260101000000.csv")
	steps(t, dump, nil, "")
	// --analysis=leaks on the file: the report lands in the capture's
	// analysis folder; --data-format=db writes a DB copy beside it.
	if rc := run([]string{"--input=" + dump, "--analysis=leaks,inefficient", "--data-format=db"}); rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	reps, _ := filepath.Glob(filepath.Join(capDir, "analysis", "leaks_*.csv"))
	if len(reps) != 1 {
		t.Fatalf("leak reports: %v", reps)
	}
	rep, _ := os.ReadFile(reps[0])
	if n := strings.Count(string(rep), "\nEXIT,"); n != 1 { // every block is alive at the end: one stack group
		t.Fatalf("leak report:\n%s", rep)
	}
	db := strings.TrimSuffix(dump, ".csv") + ".db"
	if !reflect.DeepEqual(readAll(t, dump), readAll(t, db)) {
		t.Fatal("DB copy differs from the CSV")
	}
	// --output given: the reports and the copy go there, checked first as
	// a collection's output is (a symbolic link or a folder others may
	// write: exit 2, nothing written).
	out := filepath.Join(dir, "reports")
	if rc := run([]string{"--input=" + dump, "--analysis=leaks", "--data-format=db", "--output=" + out}); rc != 0 {
		t.Fatalf("--output: exit %d", rc)
	}
	if reps, _ := filepath.Glob(filepath.Join(out, "analysis", "leaks_*.csv")); len(reps) != 1 {
		t.Errorf("--output: leak reports there: %v", reps)
	}
	if _, err := os.Stat(filepath.Join(out, filepath.Base(db))); err != nil {
		t.Errorf("--output: the DB copy is not there: %v", err)
	}
	link, open := filepath.Join(dir, "link"), filepath.Join(dir, "open")
	os.Symlink(out, link)
	os.Mkdir(open, 0o750)
	os.Chmod(open, 0o777)
	for _, o := range []string{link, open} {
		if rc := run([]string{"--input=" + dump, "--analysis=leaks", "--output=" + o}); rc != 2 {
			t.Errorf("--output=%s: exit %d, want 2", o, rc)
		}
	}
	if reps, _ := filepath.Glob(filepath.Join(open, "*")); len(reps) != 0 {
		t.Errorf("written into a folder others may write: %v", reps)
	}
	// The folder itself, now holding a CSV and a DB and no spool: the newest
	// dump (the DB) is analysed.
	if rc := run([]string{"--input=" + capDir, "--analysis=leaks"}); rc != 0 {
		t.Fatalf("folder: exit %d", rc)
	}
	// A malformed file: exit 2, file untouched.
	b, _ := os.ReadFile(dump)
	os.WriteFile(dump, []byte(strings.Replace(string(b), "size:4096", "size:x", 1)), 0o640)
	before, _ := os.ReadFile(dump)
	if rc := run([]string{"--input=" + dump, "--analysis=inefficient"}); rc != 2 {
		t.Fatalf("malformed: exit %d, want 2", rc)
	}
	if after, _ := os.ReadFile(dump); string(after) != string(before) {
		t.Fatal("malformed input changed")
	}
}

func readAll(t *testing.T, p string) []trace.Event {
	t.Helper()
	evs, err := trace.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// --analysis=decompose reads only the rows' owners: it runs on a dump file,
// CSV or DB alike, and gives the same report.
func TestOfflineDecomposeCLI(t *testing.T) {
	var reports []string
	for _, ext := range []string{".csv", ".db"} {
		capDir := filepath.Join(t.TempDir(), "msmemscope_1_20260101000000")
		dump := filepath.Join(capDir, "dump", "memscope_dump_20260101000000"+ext)
		os.MkdirAll(filepath.Dir(dump), 0o750)
		steps(t, dump, map[int]uint64{1: 100}, "")
		if rc := run([]string{"--input=" + dump, "--analysis=decompose"}); rc != 0 {
			t.Fatalf("%s: exit %d", ext, rc)
		}
		reps, _ := filepath.Glob(filepath.Join(capDir, "analysis", "decompose_*.csv"))
		if len(reps) != 1 {
			t.Fatalf("%s: decompose reports: %v", ext, reps)
		}
		rep, _ := os.ReadFile(reps[0])
		if !strings.Contains(string(rep), ",PTA,") || !strings.Contains(string(rep), "20580") { // 5 x 4096 + 100, all live
			t.Fatalf("%s: decompose report:\n%s", ext, rep)
		}
		reports = append(reports, string(rep))
	}
	if reports[0] != reports[1] {
		t.Fatalf("CSV and DB reports differ:\n%s\n%s", reports[0], reports[1])
	}
}

// A CLI built into a folder outside its checkout finds the Python startup
// hook of the checkout it was built from (make sets sourceStartup).
func TestPythonStartupDirOutsideCheckout(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "lib", "libmemscope.so")
	defer func(s string) { sourceStartup = s }(sourceStartup)
	sourceStartup = ""
	if d := pythonStartupDir(lib); d != "" {
		t.Fatalf("found %s with nothing to find", d)
	}
	hook, _ := filepath.Abs(filepath.Join("..", "..", "python", "msmemscope", "_startup"))
	sourceStartup = hook
	if d := pythonStartupDir(lib); d != hook {
		t.Fatalf("found %q, want the checkout's %s", d, hook)
	}
}
