package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"msmemscope/trace"
)

// --export=pprof: a heap profile go tool pprof reads, with Go's four sample
// types; the planted leak's function comes first by inuse_space, and the
// leak kinds of the scan at exit are labels.
func TestExportPprof(t *testing.T) {
	bin := compile(t, "pprof_leak.c", "")
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, "--call-stack=c:8", "--export=pprof", bin)
	if r.Code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.Code, r.Stderr)
	}
	path := onlyFile(t, filepath.Join(readManifest(t, out).main(t).Folder, "export", "profile_*.pb.gz"))
	if !strings.Contains(r.Stderr, "export written to "+path) {
		t.Errorf("the console does not name %s:\n%s", path, r.Stderr)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	if got := strings.Join(types, " "); got != "alloc_objects/count alloc_space/bytes inuse_objects/count inuse_space/bytes" {
		t.Errorf("sample types %s", got)
	}
	// Totals per function: lose 3 x 100000 in use; churn 1000 x 512
	// allocated, none in use; keep 50 x 64 in use.
	type tot struct{ allocN, allocB, inuseN, inuseB int64 }
	by := map[string]*tot{}
	lost := int64(0)
	for _, s := range p.Sample {
		fn := s.Location[0].Line[0].Function.Name
		if by[fn] == nil {
			by[fn] = &tot{}
		}
		x := by[fn]
		x.allocN += s.Value[0]
		x.allocB += s.Value[1]
		x.inuseN += s.Value[2]
		x.inuseB += s.Value[3]
		if s.Label["leak"] != nil && s.Label["leak"][0] == "definitely_lost" {
			lost += s.Value[3]
		}
	}
	for fn, want := range map[string]tot{"lose": {3, 300000, 3, 300000}, "churn": {1000, 512000, 0, 0}, "keep": {50, 3200, 50, 3200}} {
		if by[fn] == nil || *by[fn] != want {
			t.Errorf("%s: %+v, want %+v", fn, by[fn], want)
		}
	}
	if lost != 300000 {
		t.Errorf("definitely lost in use: %d B, want lose()'s 300000", lost)
	}
	// go tool pprof itself: the leak first by inuse_space.
	cmd := exec.Command("go", "tool", "pprof", "-top", "-sample_index=inuse_space", path)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, b)
	}
	lines := strings.Split(string(b), "\n")
	first := ""
	for i, l := range lines {
		if strings.Contains(l, "flat%") && i+1 < len(lines) {
			first = lines[i+1]
			break
		}
	}
	if !strings.HasSuffix(strings.TrimSpace(first), " lose") {
		t.Errorf("go tool pprof -top: first row %q, want lose\n%s", first, b)
	}
}

// --export offline, on a dump file: the same profile but for the leak kinds
// (a dump holds no scan), into the capture's export folder.
func TestExportPprofOffline(t *testing.T) {
	bin := compile(t, "pprof_leak.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--call-stack=c:8", bin)
	folder := readManifest(t, out).main(t).Folder
	r := runCLI(t, 60*time.Second, "", "--input="+dumpOf(t, folder), "--export=pprof")
	if r.Code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.Code, r.Stderr)
	}
	f, err := os.Open(onlyFile(t, filepath.Join(folder, "export", "profile_*.pb.gz")))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	inuse := map[string]int64{}
	for _, s := range p.Sample {
		inuse[s.Location[0].Line[0].Function.Name] += s.Value[3]
		if s.Label["leak"] != nil {
			t.Errorf("a leak kind from a dump file: %v", s.Label)
		}
	}
	if inuse["lose"] != 300000 || inuse["keep"] != 3200 || inuse["churn"] != 0 {
		t.Errorf("in use by function: %v", inuse)
	}
}

// --export names the formats it knows in its error.
func TestExportUnknownFormat(t *testing.T) {
	r := runCLI(t, 30*time.Second, "", "--export=flamegraph", "true")
	oneLineError(t, r, `invalid value "flamegraph" for --export: must be html, pprof, perfetto or memory_viz`)
}

// --export=perfetto,pprof at collection: both files; the trace holds the
// demo's five "step start" ranges as async slices and its live bytes as a
// counter whose peak is the dump's.
func TestExportPerfetto(t *testing.T) {
	bin := compile(t, filepath.Join(repoRoot, "examples", "leak_demo.c"), "", linkMemscope()...)
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, "--export=perfetto,pprof", bin)
	if r.Code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.Code, r.Stderr)
	}
	folder := readManifest(t, out).main(t).Folder
	onlyFile(t, filepath.Join(folder, "export", "profile_*.pb.gz"))
	b, err := os.ReadFile(onlyFile(t, filepath.Join(folder, "export", "trace_*.perfetto.json")))
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Ph, Name, ID string
			Args         map[string]any
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatal(err)
	}
	begins, ends := 0, 0
	peak := 0.0
	for _, e := range tr.TraceEvents {
		switch {
		case e.Ph == "b" && e.Name == "step start":
			begins++
		case e.Ph == "e" && e.Name == "step start":
			ends++
		case e.Ph == "C" && e.Name == "live bytes by type":
			v, _ := e.Args["HOST"].(float64)
			peak = max(peak, v)
		}
	}
	// The dump's own peak of live HOST bytes.
	var live, dumpPeak int64
	for _, e := range readDump(t, dumpOf(t, folder)) {
		if e.Type != trace.TypeHost {
			continue
		}
		if e.Kind == trace.KindMalloc {
			live += int64(e.Size)
		} else if e.Kind == trace.KindFree {
			live -= int64(e.Size)
		}
		dumpPeak = max(dumpPeak, live)
	}
	if begins != 5 || ends != 5 || int64(peak) != dumpPeak {
		t.Errorf("%d range begins, %d ends (want 5 each); counter peak %v, the dump's %d", begins, ends, peak, dumpPeak)
	}
}

// A SQLite dump people can query: the typed view answers SQL over the
// Attr's numbers (here with the sqlite3 shell, on a million rows).
func TestSQLiteTypedViewQuery(t *testing.T) {
	if _, err := exec.LookPath("sqlite3"); err != nil {
		t.Fatalf("sqlite3 (Debian's, installed by make deps) is needed: %v", err)
	}
	bin := compile(t, "dbquery.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--data-format=db", "--analysis=", bin)
	db := onlyFile(t, filepath.Join(readManifest(t, out).main(t).Folder, "dump", "memscope_dump_*.db"))
	q := func(sql string) string {
		b, err := exec.Command("sqlite3", db, sql).CombinedOutput()
		if err != nil {
			t.Fatalf("sqlite3 %q: %v\n%s", sql, err, b)
		}
		return strings.TrimSpace(string(b))
	}
	if got := q(`SELECT owner, sum(size), count(*) FROM memscope_dump_typed WHERE Event = 'MALLOC' GROUP BY owner`); got != "HOST|57814000|501000" {
		t.Errorf("MALLOC bytes by owner: %q, want HOST|57814000|501000", got)
	}
	// FREEs pair with their MALLOCs by allocation_id, as integers.
	if got := q(`SELECT count(*) FROM (SELECT allocation_id FROM memscope_dump_typed WHERE Event IN ('MALLOC', 'FREE') GROUP BY allocation_id HAVING count(*) = 2 AND min(size) = max(size))`); got != "500000" {
		t.Errorf("FREEs paired by allocation_id: %s, want 500000", got)
	}
	// Bytes by owner from the side table's index alone (no row read).
	const byOwner = `SELECT owner, sum(size) FROM memscope_attr WHERE owner IS NOT NULL GROUP BY owner`
	if got := q(byOwner); got != "HOST|57814000" {
		t.Errorf("bytes by owner: %q, want HOST|57814000", got)
	}
	if plan := q("EXPLAIN QUERY PLAN " + byOwner); !strings.Contains(plan, "COVERING INDEX memscope_attr_owner") {
		t.Errorf("%s does not read the index alone:\n%s", byOwner, plan)
	}
	if got := q(`SELECT count(*) FROM memscope_attr WHERE ptr IS NOT NULL AND ptr != addr`); got != "0" {
		t.Errorf("%s memory rows whose ptr and addr differ", got)
	}
}
