package collect

import (
	"database/sql"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"msmemscope/capture"
	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/spool"
	"msmemscope/trace"

	_ "modernc.org/sqlite"
)

// A spool converted to CSV and to SQLite gives the same rows, and the
// python_trace CSVs beside the dump become table python_trace_{pid}.
func TestConvertDataFormatDB(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.Output = dir
	cfg.Analysis = []string{"leaks"}
	p, err := capture.Begin(cfg, 4242, "")
	if err != nil {
		t.Fatal(err)
	}
	var recs [][4]uint64
	tick := uint64(1_000_000)
	for i := uint64(0); i < 5000; i++ {
		tick += 10
		recs = append(recs, [4]uint64{tick, 0x100000 + i*64, 16 + i%100, format.RMalloc})
		if i%7 != 0 {
			tick += 10
			recs = append(recs, [4]uint64{tick, 0x100000 + i*64, 0, format.RFree})
		}
	}
	if _, err := syscall.Write(p.SpoolFD(), append(calibRec(1_000_000, 1), chunkOf(7, recs)...)); err != nil {
		t.Fatal(err)
	}
	p.End(0, 0)
	tr := "FuncInfo,StartTime(ns),EndTime(ns),Thread Id,Process Id\na.py:1(f),10,20,7,4242\n"
	if err := os.MkdirAll(filepath.Join(p.Dir, spool.DumpDir), 0o750); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(p.Dir, spool.DumpDir, "python_trace_7_20260101000000.csv"), []byte(tr), 0o640)

	csvRes, err := Convert(p.Dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	dbCfg := cfg
	dbCfg.DataFormat = "db"
	dbRes, err := Convert(p.Dir, Options{Config: &dbCfg})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(dbRes.DumpPath, ".db") || !strings.HasSuffix(csvRes.DumpPath, ".csv") {
		t.Fatalf("dump paths %s, %s", csvRes.DumpPath, dbRes.DumpPath)
	}
	if csvRes.Rows != dbRes.Rows || csvRes.Rows < 5000 {
		t.Fatalf("rows: csv %d, db %d", csvRes.Rows, dbRes.Rows)
	}
	a, b := readDump(t, csvRes.DumpPath), readDump(t, dbRes.DumpPath)
	if len(a) == 0 || !reflect.DeepEqual(a, b) {
		t.Fatalf("CSV and DB dumps differ (%d and %d rows)", len(a), len(b))
	}
	if len(dbRes.Leaks.ExitLeaks) == 0 || !reflect.DeepEqual(csvRes.Leaks, dbRes.Leaks) {
		t.Fatalf("leak reports differ")
	}
	if st, err := os.Stat(dbRes.DumpPath); err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("db file mode: %v %v", st, err)
	}
	if _, err := os.Stat(dbRes.DumpPath + ".partial"); !os.IsNotExist(err) {
		t.Fatalf("partial DB left: %v", err)
	}
	db, err := sql.Open("sqlite", "file:"+dbRes.DumpPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var f string
	var start, end, tid, pid int64
	if err := db.QueryRow(`SELECT * FROM python_trace_4242`).Scan(&f, &start, &end, &tid, &pid); err != nil ||
		f != "a.py:1(f)" || start != 10 || end != 20 || tid != 7 || pid != 4242 {
		t.Fatalf("python_trace_4242: %q %d %d %d %d, %v", f, start, end, tid, pid, err)
	}
}

func readDump(t *testing.T, p string) []trace.Event {
	t.Helper()
	evs, err := trace.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// chunkOf builds one drained chunk (spool chunk format) of full records.
func chunkOf(tid int32, recs [][4]uint64) []byte {
	var body []byte
	for _, r := range recs {
		body = spool.AppendRec(body, &spool.Rec{TS: r[0], A: r[1], B: r[2], Kind: uint16(r[3]), Flags: format.FHost})
	}
	return chunk(tid, body)
}

func calibRec(tick, epoch uint64) []byte {
	return chunk(0, spool.AppendRec(nil, &spool.Rec{TS: tick, A: tick, B: epoch, Kind: format.RCalib, Flags: format.FEpoch}))
}

// chunk frames records as the drain does: magic, record units, tid, pid.
func chunk(tid int32, body []byte) []byte {
	return spool.AppendChunk(nil, format.ChunkMagic, tid, body)
}
