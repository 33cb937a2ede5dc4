package spool

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/trace"
)

// captureFolder writes an output folder holding one capture folder whose
// spool is sb, and returns both.
func captureFolder(t *testing.T, sb *spoolBuilder) (out, capDir string) {
	t.Helper()
	out = t.TempDir()
	capDir = filepath.Join(out, "msmemscope_7_20260101000000")
	if err := os.MkdirAll(filepath.Join(capDir, SpoolDir), 0o750); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ProcessMeta{Pid: 7, Config: config.Default()})
	os.WriteFile(filepath.Join(capDir, SpoolDir, ProcessFile), b, 0o640)
	os.WriteFile(filepath.Join(capDir, SpoolDir, FileName), sb.b.Bytes(), 0o640)
	return out, capDir
}

// captureRows opens a capture folder and writes each of its rows by row.
func captureRows(t *testing.T, capDir string, row func(*trace.Event) string) []string {
	t.Helper()
	in, err := Open(capDir, trace.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var got []string
	for _, e := range readInput(t, in) {
		got = append(got, row(&e))
	}
	return got
}

func readInput(t *testing.T, in trace.Input) []trace.Event {
	t.Helper()
	evs, err := trace.ReadAll(in)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// Open reads a capture the same way whichever path names it: the output
// folder, the capture folder, the spool file; then, once the capture has a
// dump, the dump (CSV), which holds the same rows.
func TestOpenAnyInput(t *testing.T) {
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1))
	sb.chunk(5,
		rec{ts: 1100, a: 0x1000, b: 64, kind: format.RMalloc, flags: format.FHost},
		rec{ts: 1200, a: 0x2000, b: 32, kind: format.RMalloc, flags: format.FHost},
		rec{ts: 1300, a: 0x1000, kind: format.RFree, flags: format.FHost},
	)
	out, capDir := captureFolder(t, sb)
	var want []trace.Event
	for i, p := range []string{capDir, out, filepath.Join(capDir, SpoolDir), filepath.Join(capDir, SpoolDir, FileName)} {
		f, err := Find(p)
		if err != nil {
			t.Fatalf("Find(%s): %v", p, err)
		}
		if f.Capture != capDir {
			t.Errorf("Find(%s).Capture = %q, want %q", p, f.Capture, capDir)
		}
		in, err := Open(p, trace.OpenOptions{})
		if err != nil {
			t.Fatalf("Open(%s): %v", p, err)
		}
		if in.Format() != FormatSpool {
			t.Errorf("Open(%s): format %s", p, in.Format())
		}
		evs := readInput(t, in)
		if done, total := in.Progress(); done != total || total != 4 { // the calibration counts too
			t.Errorf("Open(%s): progress %d of %d, want 4 of 4", p, done, total)
		}
		// Lookup decodes again and finds the same rows.
		var looked []trace.Event
		if err := in.Lookup([]uint64{1, 3}, func(e *trace.Event) error { looked = append(looked, *e); return nil }); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if len(evs) != 3 || len(looked) != 2 || !reflect.DeepEqual(looked[1], evs[2]) {
			t.Fatalf("Open(%s): %d events, lookup %v", p, len(evs), looked)
		}
		if i == 0 {
			want = evs
		} else if !reflect.DeepEqual(evs, want) {
			t.Errorf("Open(%s) differs from Open(%s)", p, capDir)
		}
	}
	// Kinds filters spool rows as it filters dump rows.
	in, err := Open(capDir, trace.OpenOptions{Kinds: []trace.Kind{trace.KindFree}})
	if err != nil {
		t.Fatal(err)
	}
	if evs := readInput(t, in); len(evs) != 1 || evs[0].Kind != trace.KindFree || evs[0].Size != 64 {
		t.Errorf("Kinds FREE: %+v", evs)
	}
	in.Close()

	// A dump beside the spool is read instead (it is what was written).
	os.MkdirAll(filepath.Join(capDir, DumpDir), 0o750)
	dump := filepath.Join(capDir, DumpDir, "memscope_dump_20260101000000.csv")
	f, _ := os.Create(dump)
	bw := bufio.NewWriter(f)
	w := trace.NewCSVWriter(bw)
	for i := range want {
		w.Write(&want[i])
	}
	w.Flush()
	bw.Flush()
	f.Close()
	for _, p := range []string{capDir, out, dump} {
		in, err := Open(p, trace.OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if in.Format() != trace.FormatCSV || in.Path() != dump {
			t.Errorf("Open(%s): %s %s, want the CSV dump", p, in.Format(), in.Path())
		}
		if evs := readInput(t, in); len(evs) != len(want) || evs[1].Size != want[1].Size || evs[1].Ptr != want[1].Ptr {
			t.Errorf("Open(%s): %+v, want %+v", p, evs, want)
		}
		in.Close()
	}
	// Capture: the spool, whole, all the same (a dump may be --steps
	// filtered); a dump file named is still that dump.
	for p, wantFormat := range map[string]string{capDir: FormatSpool, out: FormatSpool, dump: trace.FormatCSV} {
		in, err := Open(p, trace.OpenOptions{Capture: true})
		if err != nil {
			t.Fatal(err)
		}
		if in.Format() != wantFormat {
			t.Errorf("Open(%s, Capture): %s, want %s", p, in.Format(), wantFormat)
		}
		in.Close()
	}
}

func TestFindErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Find(filepath.Join(dir, "none")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing path: %v", err)
	}
	// An output folder with two captures and no manifest: name one.
	for _, n := range []string{"msmemscope_1_1", "msmemscope_2_1"} {
		os.MkdirAll(filepath.Join(dir, n, DumpDir), 0o750)
		os.WriteFile(filepath.Join(dir, n, DumpDir, "memscope_dump_1.csv"), []byte{}, 0o640)
	}
	if _, err := Find(dir); err == nil || !strings.Contains(err.Error(), "holds 2 captures") {
		t.Errorf("two captures: %v", err)
	}
	// A manifest names the main one.
	m := Manifest{Processes: []ManifestProcess{{Pid: 1, Folder: filepath.Join(dir, "msmemscope_2_1"), Main: true}}}
	b, _ := json.Marshal(m)
	os.WriteFile(filepath.Join(dir, "run_1.json"), b, 0o640)
	if f, err := Find(dir); err != nil || f.Capture != filepath.Join(dir, "msmemscope_2_1") {
		t.Errorf("manifest: %+v %v", f, err)
	}
}

// msmemscope.config() between and within ranges (RConfig records): each
// operator's rows are as the configuration then asked, from the capture's
// own at its start; a decoder not told to follow keeps its configuration
// throughout.
func TestTorchRowsFollowTheConfiguration(t *testing.T) {
	text := func(kind uint16, ts, a uint64, s string) rec {
		return rec{ts: ts, a: a, b: uint64(len(s)), kind: kind, flags: format.FText, payload: []byte(s)}
	}
	conf := func(ts uint64, launch, access bool) rec {
		c := config.Default()
		c.Events.Launch, c.Events.Access = launch, access
		return text(format.RConfig, ts, 0, c.Encode())
	}
	op := func(ts, n uint64, name string) []rec {
		return []rec{text(format.ROpStart, ts, n, name+"\nR 1000 1000 64 float [16] ND"), text(format.ROpEnd, ts+10, n, name)}
	}
	recs := []rec{{ts: 1050, a: 0x1000, b: 64, kind: format.RMalloc, flags: format.FHost}}
	recs = append(recs, op(1100, 1, "aten::one")...) // the capture's start: launch, no access
	recs = append(recs, conf(1200, true, true))      // config(events=...,access)
	recs = append(recs, op(1300, 2, "aten::two")...)
	recs = append(recs, conf(1400, false, false)) // config(events="alloc,free")
	recs = append(recs, op(1500, 3, "aten::three")...)
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1))
	sb.chunk(5, recs...)
	_, capDir := captureFolder(t, sb)
	start := config.Default() // alloc,free,launch
	b, _ := json.Marshal(ProcessMeta{Pid: 7, Config: start})
	os.WriteFile(filepath.Join(capDir, SpoolDir, ProcessFile), b, 0o640)
	row := func(e *trace.Event) string { return e.Kind.String() + " " + e.Type + " " + e.Name }
	got := captureRows(t, capDir, row)
	want := []string{"MALLOC PTA ", "OP_LAUNCH ATEN_START aten::one", "OP_LAUNCH ATEN_END aten::one",
		"OP_LAUNCH ATEN_START aten::two", "ACCESS READ aten::two", "OP_LAUNCH ATEN_END aten::two"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rows:\n got %q\nwant %q", got, want)
	}
	// Not told to follow (FollowConfig), the decoder keeps its configuration.
	sp, err := OpenCapture(capDir)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	meta := &ProcessMeta{Pid: 7, Config: start}
	d := NewDecoder(sp, capDir, meta, start)
	if err := d.DecodeTorch(); err != nil {
		t.Fatal(err)
	}
	var kept []string
	if err := trace.Each(d, func(e *trace.Event) error { kept = append(kept, row(e)); return nil }); err != nil {
		t.Fatal(err)
	}
	wantKept := []string{"MALLOC PTA ", "OP_LAUNCH ATEN_START aten::one", "OP_LAUNCH ATEN_END aten::one",
		"OP_LAUNCH ATEN_START aten::two", "OP_LAUNCH ATEN_END aten::two",
		"OP_LAUNCH ATEN_START aten::three", "OP_LAUNCH ATEN_END aten::three"}
	if !reflect.DeepEqual(kept, wantKept) {
		t.Errorf("rows with the decoder's configuration:\n got %q\nwant %q", kept, wantKept)
	}
}

// A spool opened with Open gives the PyTorch rows its dump has: operator
// launches, accesses, and PTA blocks.
func TestOpenSpoolTorchRows(t *testing.T) {
	text := func(kind uint16, ts, a uint64, s string) rec {
		return rec{ts: ts, a: a, b: uint64(len(s)), kind: kind, flags: format.FText, payload: []byte(s)}
	}
	sb := newSpoolBuilder(7)
	sb.chunk(0, calib(1000, 1))
	sb.chunk(5,
		text(format.ROpStart, 1100, 1, "aten::empty"),
		rec{ts: 1200, a: 0x1000, b: 64, kind: format.RMalloc, flags: format.FHost},
		text(format.ROpEnd, 1300, 1, "aten::empty\nN 1000 1000 64 float [16] ND"),
		text(format.ROpStart, 1400, 2, "aten::add\nR 1000 1000 64 float [16] ND"),
		text(format.ROpEnd, 1500, 2, "aten::add"),
	)
	_, capDir := captureFolder(t, sb)
	cfg := config.Default()
	cfg.Events.Access = true // --events=...,access
	b, _ := json.Marshal(ProcessMeta{Pid: 7, Config: cfg})
	os.WriteFile(filepath.Join(capDir, SpoolDir, ProcessFile), b, 0o640)
	got := captureRows(t, capDir, func(e *trace.Event) string { return e.Kind.String() + " " + e.Type + " " + e.Name })
	want := []string{"OP_LAUNCH ATEN_START aten::empty", "MALLOC PTA ", "OP_LAUNCH ATEN_END aten::empty",
		"OP_LAUNCH ATEN_START aten::add", "ACCESS READ aten::add", "OP_LAUNCH ATEN_END aten::add"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rows:\n got %q\nwant %q", got, want)
	}
	// OpenStream (the live report, the timeline) keeps to blocks.
	s, closeFn, err := OpenStream(capDir)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	if e, _ := s.Next(); e == nil || e.Kind != trace.KindMalloc || e.Type != trace.TypeHost {
		t.Errorf("OpenStream: first row %+v, want the HOST MALLOC", e)
	}
}
