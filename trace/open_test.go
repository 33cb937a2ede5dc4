package trace

import (
	"bytes"
	"database/sql/driver"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// readInput reads every event of in.
func readInput(t testing.TB, in Input) ([]Event, error) {
	t.Helper()
	var evs []Event
	for {
		e, err := in.Next()
		if err != nil {
			return evs, err
		}
		if e == nil {
			return evs, nil
		}
		evs = append(evs, *e)
	}
}

func openBytes(t testing.TB, data []byte, name string, opt OpenOptions) (Input, error) {
	t.Helper()
	return newCSVInput(io.NopCloser(bytes.NewReader(data)), name, int64(len(data)), opt, nil)
}

// openMapped opens data written to a file, mapped whatever its size.
func openMapped(t testing.TB, data []byte, name string, opt OpenOptions) (Input, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dump.csv")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	saved := csvMapMin
	csvMapMin = 1
	defer func() { csvMapMin = saved }()
	in, err := newCSVInput(f, name, int64(len(data)), opt, nil)
	if err != nil {
		f.Close()
		return nil, err
	}
	if len(data) > 0 && in.mapped == nil {
		t.Fatal("not mapped")
	}
	return in, nil
}

func leanOf(evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, e := range evs {
		e.Extra, e.PyStack, e.CStack = nil, "", ""
		out[i] = e
	}
	return out
}

// checkSameAsCSVReader reads data with csvReader and with the CSV input
// (lean and full, one and several workers, tiny chunks) and wants the same
// events and the same error.
func checkSameAsCSVReader(t *testing.T, data []byte) {
	t.Helper()
	want, werr := readAll(t, data, "x.csv")
	for _, lean := range []bool{false, true} {
		for _, workers := range []int{1, 3} {
			open := openBytes
			if workers == 3 { // the read path is workers=1's
				open = openMapped
			}
			in, err := open(t, data, "x.csv", OpenOptions{Lean: lean, Workers: workers, Reuse: workers == 3})
			if err != nil {
				if werr == nil || err.Error() != werr.Error() || len(want) > 0 {
					t.Fatalf("lean=%v: open: %v; csvReader: %d events, %v", lean, err, len(want), werr)
				}
				continue
			}
			got, gerr := readInput(t, in)
			in.Close()
			w := want
			if lean {
				w = leanOf(want)
			}
			if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
				t.Fatalf("lean=%v workers=%d: error %v, csvReader's %v", lean, workers, gerr, werr)
			}
			if len(got) != len(w) || (len(w) > 0 && !reflect.DeepEqual(got, w)) {
				t.Fatalf("lean=%v workers=%d: events differ:\n got %+v\nwant %+v", lean, workers, got, w)
			}
		}
	}
}

func TestOpenCSVMatchesCSVReader(t *testing.T) {
	saved := csvChunkSize
	defer func() { csvChunkSize = saved }()
	hdr := strings.Join(CSVHeader, ",") + "\n"
	inputs := [][]byte{
		writeCSV(t, sampleEvents()),
		writeCSV(t, manyEvents(5000)),
		[]byte(hdr),
		[]byte("\n\r\n" + hdr + "\n1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A"),
		[]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4,owner:HOST,x:y}\",N/A,\"a;b\"\r\n"),
		[]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:x4}\",N/A,N/A\n"),
		[]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4,}\",N/A,N/A\n"),
		[]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10}\",N/A,N/A\n"),
		[]byte(hdr + "1,FREE,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x11,size:4}\",N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A,extra\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,\"unterminated\n2,SYSTEM,STOP,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n2,SYSTEM,ST"),
		[]byte(hdr + "1,SYS\"TEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,MSTX,Mark,\"a\"\"b\",1,-1,1,N/A,N/A,{id:7},\"x\ny\",N/A\r\n2,MSTX,Mark,m,1,1,1,N/A,N/A,{id:8},N/A,N/A\n"),
		// The leading fields, parsed as they are found, against csvReader.
		[]byte(hdr + "\"1\",MALLOC,\"HOST\",N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4}\",N/A,N/A\n"),
		[]byte(hdr + "007,SYSTEM,START,,18446744073709551615,-9223372036854775808,9223372036854775807,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,18446744073709551616,1,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,-9223372036854775809,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,--1,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,-5,-0,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,-,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,a\"b,1,1,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,1,1,\"host\",N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0X0010,\"{allocation_id:1,addr:0x10,size:4}\",N/A,N/A\n"),
		[]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,N/A,\"{allocation_id:1,addr:0x10,size:4}\",N/A,N/A\n"),
		// Values recognized whole, and their near misses.
		[]byte(hdr + "1,MALLOCX,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4}\",N/A,N/A\n"),
		[]byte(hdr + "1,MALLOC,HOST,N/AB,1,1,1,N/A,0x00000000000000010,\"{allocation_id:1,addr:0x10,size:4}\",N/A,N/A\n"),
		[]byte(hdr + "1,FREE,HOST,N/A,1,1,1,host,0x10x,\"{allocation_id:1,addr:0x10,size:4}\",N/A,N/A\n"),
		[]byte(hdr + "1,OP_LAUNCH,ATEN_START,N/A,1,1,1,host,0x,{},N/A,N/A\n2,ACCESS,READ,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte(hdr + "1,SYSTEM,START,N/A,1,1,1,N/A\n"),
		[]byte(hdr + ",SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n"),
		[]byte("ID,Event\n1,SYSTEM\n"),
		[]byte(""),
	}
	for _, size := range []int{16, 100, 1 << 20} {
		csvChunkSize = size
		for i, in := range inputs {
			t.Run("", func(t *testing.T) {
				_ = i
				checkSameAsCSVReader(t, in)
			})
		}
	}
}

// A mapped dump that shrinks while it is read gives an error, not SIGBUS.
func TestOpenMappedShrinks(t *testing.T) {
	saved := csvChunkSize
	csvChunkSize = 4096
	defer func() { csvChunkSize = saved }()
	data := writeCSV(t, manyEvents(20000))
	in, err := openMapped(t, data, "x.csv", OpenOptions{Lean: true, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if e, err := in.Next(); e == nil || err != nil {
		t.Fatalf("first event: %v %v", e, err)
	}
	if err := os.Truncate(in.(*csvInput).f.(*os.File).Name(), 0); err != nil {
		t.Fatal(err)
	}
	n := 1
	for {
		e, err := in.Next()
		if err != nil {
			if !strings.Contains(err.Error(), "x.csv: the file shrank while it was read") {
				t.Fatalf("error %v", err)
			}
			break
		}
		if e == nil {
			t.Fatalf("no error after %d of 20000 events", n)
		}
		n++
	}
	if n >= 20000 {
		t.Fatalf("read all %d events of a file cut to nothing", n)
	}
}

func FuzzOpenCSV(f *testing.F) {
	hdr := strings.Join(CSVHeader, ",") + "\n"
	f.Add(writeCSV(f, sampleEvents()))
	f.Add([]byte(hdr))
	f.Add([]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4,owner:HOST,x:y}\",N/A,\"a;b\"\n"))
	f.Add([]byte(hdr + "1,MSTX,Mark,\"a\"\"b\",1,-1,1,N/A,N/A,{id:7},\"x\ny\",N/A\r\n"))
	f.Add([]byte(hdr + "1,ACCESS,READ,aten::add,1,1,1,0,N/A,\"{dtype:float,size:8,allocation_id:3,size:9}\",N/A,N/A\n"))
	f.Add([]byte(hdr + "1,MALLOC,PTA,N/A,1,1,1,0,0x10,\"{allocation_id:1,addr:0x010,size:4,shadow:true,inefficient:a|b}\",N/A,N/A"))
	saved := csvChunkSize
	csvChunkSize = 64
	f.Cleanup(func() { csvChunkSize = saved })
	f.Fuzz(func(t *testing.T, data []byte) {
		checkSameAsCSVReader(t, data)
	})
}

func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o640); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeDB(t testing.TB, path string, evs []Event) {
	t.Helper()
	w, err := CreateSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range evs {
		if err := w.Write(&evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func readPath(t testing.TB, path string, opt OpenOptions) []Event {
	t.Helper()
	in, err := Open(path, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	evs, err := readInput(t, in)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// sqliteComparable drops what a SQLite round trip cannot keep apart from the
// CSV's: nothing (both store the same text).
func TestSQLiteRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, evs := range [][]Event{sampleEvents(), manyEvents(3000), nil} {
		csvPath := writeFile(t, dir, "d.csv", writeCSV(t, evs))
		dbPath := filepath.Join(dir, "d.db")
		os.Remove(dbPath)
		writeDB(t, dbPath, evs)
		if _, err := os.Stat(dbPath + ".partial"); !os.IsNotExist(err) {
			t.Fatalf("partial file left behind: %v", err)
		}
		for _, lean := range []bool{false, true} {
			fromCSV := readPath(t, csvPath, OpenOptions{Lean: lean})
			fromDB := readPath(t, dbPath, OpenOptions{Lean: lean})
			if len(fromCSV) != len(evs) || !reflect.DeepEqual(fromCSV, fromDB) {
				t.Fatalf("lean=%v: CSV and DB differ:\ncsv %+v\n db %+v", lean, fromCSV, fromDB)
			}
		}
		// Lookup gives complete rows, in file order, on both.
		if len(evs) > 3 {
			ids := []uint64{evs[1].ID, evs[3].ID}
			for _, p := range []string{csvPath, dbPath} {
				in, err := Open(p, OpenOptions{Lean: true})
				if err != nil {
					t.Fatal(err)
				}
				var got []Event
				if err := in.Lookup(ids, func(e *Event) error { got = append(got, *e); return nil }); err != nil {
					t.Fatal(err)
				}
				in.Close()
				if !reflect.DeepEqual(got, []Event{evs[1], evs[3]}) {
					t.Fatalf("%s: Lookup = %+v", p, got)
				}
			}
		}
	}
}

func TestSQLiteSchema(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d.db")
	writeDB(t, p, sampleEvents())
	c, err := openSQLite(p, "mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rows, err := c.query(`SELECT type, name FROM sqlite_master ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	v := make([]driver.Value, 2)
	for rows.Next(v) == nil {
		a, _ := dbString(v[0])
		b, _ := dbString(v[1])
		got = append(got, a+" "+b)
	}
	rows.Close()
	want := []string{"table memscope_attr", "index memscope_attr_owner",
		"table memscope_dump", "index memscope_dump_Event", "index memscope_dump_Ptr", "view memscope_dump_typed"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("schema %q, want %q", got, want)
	}
	// The typed view: every row, its Attr's numbers as integers, NULL where
	// the row has none.
	rows, err = c.query(`SELECT "ID", "Event", "size", "owner", "allocation_id", "addr", "ptr_int", "step" FROM memscope_dump_typed ORDER BY "ID"`)
	if err != nil {
		t.Fatal(err)
	}
	evs := sampleEvents()
	v = make([]driver.Value, 8)
	n := 0
	for rows.Next(v) == nil {
		e := evs[n]
		n++
		if id, _ := v[0].(int64); uint64(id) != e.ID {
			t.Fatalf("row %d: ID %v, want %d", n, v[0], e.ID)
		}
		mem := e.Kind == KindMalloc || e.Kind == KindFree || e.Kind == KindAccess
		if size, ok := v[2].(int64); mem != ok || (ok && uint64(size) != e.Size) {
			t.Errorf("row %d (%s): size %v, want %d (NULL unless a memory row)", e.ID, e.Kind, v[2], e.Size)
		}
		if owner, _ := dbString(v[3]); e.Kind == KindMalloc && owner != e.Owner {
			t.Errorf("row %d: owner %q, want %q", e.ID, owner, e.Owner)
		}
		if p, ok := v[6].(int64); ok != e.HasPtr || (ok && uint64(p) != e.Ptr) {
			t.Errorf("row %d: ptr %v, want %x", e.ID, v[6], e.Ptr)
		}
		if st, _ := v[7].(int64); int(st) != e.Step {
			t.Errorf("row %d: step %v, want %d", e.ID, v[7], e.Step)
		}
	}
	rows.Close()
	if n != len(evs) {
		t.Errorf("%d rows in the view, want %d", n, len(evs))
	}
	if _, err := CreateSQLite(p); err == nil {
		t.Fatal("CreateSQLite overwrote an existing file")
	}
}

func TestSQLitePythonTrace(t *testing.T) {
	dir := t.TempDir()
	tr := writeFile(t, dir, "python_trace_7_1.csv", []byte("FuncInfo,StartTime(ns),EndTime(ns),Thread Id,Process Id\n"+
		"a.py:1(f),10,20,7,42\n\"b.py:2(g, h)\",11,19,7,42\n"))
	p := filepath.Join(dir, "d.db")
	w, err := CreateSQLite(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddPythonTrace(42, tr); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c, _ := openSQLite(p, "mode=ro")
	defer c.Close()
	rows, err := c.query(`SELECT * FROM python_trace_42`)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]driver.Value, 5)
	var got []string
	for rows.Next(v) == nil {
		var parts []string
		for _, x := range v {
			s, _ := dbString(x)
			parts = append(parts, s)
		}
		got = append(got, strings.Join(parts, "|"))
	}
	rows.Close()
	if want := []string{"a.py:1(f)|10|20|7|42", "b.py:2(g, h)|11|19|7|42"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("python_trace_42 = %q, want %q", got, want)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	hdr := strings.Join(CSVHeader, ",") + "\n"
	good := writeCSV(t, sampleEvents())
	cases := []struct {
		name string
		data []byte
		want string // a substring of the error
	}{
		{"missing_col.csv", []byte(strings.Replace(hdr, ",Attr", "", 1) + "1,SYSTEM\n"), `x:1: header: missing column "Attr"`},
		{"attr.csv", []byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4\",N/A,N/A\n"), `x:2: malformed Attr`},
		{"size.csv", []byte(hdr + "1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n2,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4k}\",N/A,N/A\n"), `x:3: malformed Attr "{allocation_id:1,addr:0x10,size:4k}": bad size "4k"`},
		{"trunc.csv", good[:len(good)-40], `truncated last line`},
		{"empty.csv", nil, `x:1: empty file: no header row`},
		// binary bytes (a damaged log given alone): named as such, not
		// as a quote or a column of the header
		{"garbage.zst", []byte("\x28\xb5\x2e\xfd\x04\x87\"\x00\x13,ID\n"), `x: not a dump CSV or DB, a spool or a rotated log: its first bytes are binary`},
		{"latin1.csv", []byte("ID\xe9,Event\n"), `its first bytes are binary`},
	}
	for _, c := range cases {
		p := writeFile(t, dir, c.name, c.data)
		before, _ := os.ReadFile(p)
		err := openAndRead(p)
		if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), p, "x"), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error spans lines: %q", c.name, err)
		}
		after, _ := os.ReadFile(p)
		if !bytes.Equal(before, after) {
			t.Errorf("%s: input changed", c.name)
		}
	}
	if err := openAndRead(dir); err == nil || !strings.Contains(err.Error(), dir+": is a directory") {
		t.Errorf("directory: %v", err)
	}
	if err := openAndRead(filepath.Join(dir, "nope.csv")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	// A database without the table, and one with a column missing.
	nodump := filepath.Join(dir, "other.db")
	c, err := openSQLite(nodump, "")
	if err != nil {
		t.Fatal(err)
	}
	c.exec(`CREATE TABLE t (a)`)
	c.exec(`CREATE TABLE "memscope_dump2" (a)`)
	c.Close()
	if err := openAndRead(nodump); err == nil || err.Error() != nodump+": no table memscope_dump: not an msmemscope dump" {
		t.Errorf("no table: %v", err)
	}
	badcol := filepath.Join(dir, "badcol.db")
	c, _ = openSQLite(badcol, "")
	c.exec(`CREATE TABLE memscope_dump ("ID", "Event", "Event Type", "Name", "Timestamp(ns)", "Process Id", "Thread Id", "Device Id", "Ptr", "Call Stack(Python)", "Call Stack(C)")`)
	c.Close()
	if err := openAndRead(badcol); err == nil || !strings.Contains(err.Error(), `table memscope_dump: missing column "Attr"`) {
		t.Errorf("missing DB column: %v", err)
	}
	// A bad value inside a database: file and row.
	baddb := filepath.Join(dir, "badval.db")
	evs := sampleEvents()[:4]
	writeDB(t, baddb, evs)
	c, _ = openSQLite(baddb, "")
	c.exec(`UPDATE memscope_dump SET "Attr" = '{allocation_id:2,addr:0x7f31c0000040,size:big}' WHERE "ID" = 4`)
	c.Close()
	if err := openAndRead(baddb); err == nil || !strings.HasPrefix(err.Error(), baddb+": row 4: malformed Attr") {
		t.Errorf("bad DB value: %v", err)
	}
	// A truncated database file.
	full, _ := os.ReadFile(filepath.Join(dir, "badval.db"))
	trunc := writeFile(t, dir, "trunc.db", full[:len(full)/3])
	if err := openAndRead(trunc); err == nil || !strings.HasPrefix(err.Error(), trunc+": ") {
		t.Errorf("truncated DB: %v", err)
	}
	notdb := writeFile(t, dir, "text.db", []byte("hello"))
	if err := openAndRead(notdb); err == nil || err.Error() != notdb+": not an SQLite database" {
		t.Errorf("not a DB: %v", err)
	}
}

func openAndRead(p string) error {
	in, err := Open(p, OpenOptions{})
	if err != nil {
		return err
	}
	defer in.Close()
	for {
		e, err := in.Next()
		if err != nil {
			return err
		}
		if e == nil {
			return nil
		}
	}
}

func TestCloseEarly(t *testing.T) {
	saved := csvChunkSize
	csvChunkSize = 256
	defer func() { csvChunkSize = saved }()
	dir := t.TempDir()
	evs := manyEvents(20000)
	for _, p := range []string{writeFile(t, dir, "a.csv", writeCSV(t, evs)), filepath.Join(dir, "a.db")} {
		if strings.HasSuffix(p, ".db") {
			writeDB(t, p, evs)
		}
		in, err := Open(p, OpenOptions{Lean: true})
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			in.Next()
		}
		in.Close() // must not hang
	}
}

func TestAddInefficient(t *testing.T) {
	dir := t.TempDir()
	evs := sampleEvents()
	for _, format := range []string{"csv", "db"} {
		p := filepath.Join(dir, "d."+format)
		if format == "csv" {
			writeFile(t, dir, "d.csv", writeCSV(t, evs))
		} else {
			writeDB(t, p, evs)
		}
		// Row 3 has no results yet; row 4 has two; row 5 is a FREE.
		marks := []IneffMark{{3, []string{"late_deallocation"}}, {4, []string{"temporary_idleness", "late_deallocation"}}, {5, []string{"early_allocation"}}}
		n, err := AddInefficient(p, marks, nil)
		if err != nil || n != 2 {
			t.Fatalf("%s: added %d, %v; want 2", format, n, err)
		}
		got := readPath(t, p, OpenOptions{})
		want := append([]Event(nil), evs...)
		want[2].Inefficient = "late_deallocation"
		want[3].Inefficient = "early_allocation|temporary_idleness|late_deallocation"
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: after AddInefficient:\n got %+v\nwant %+v", format, got, want)
		}
		before, _ := os.ReadFile(p)
		st, _ := os.Stat(p)
		if n, err := AddInefficient(p, marks, nil); err != nil || n != 0 {
			t.Fatalf("%s: second run added %d, %v", format, n, err)
		}
		after, _ := os.ReadFile(p)
		st2, _ := os.Stat(p)
		if !bytes.Equal(before, after) || !st.ModTime().Equal(st2.ModTime()) {
			t.Fatalf("%s: a run adding nothing rewrote the file", format)
		}
		if format == "csv" {
			// Only the changed rows differ from a fresh write.
			if !bytes.Equal(after, writeCSV(t, want)) {
				t.Fatalf("csv rewrite is not the canonical file:\n%s", after)
			}
			if ents, _ := filepath.Glob(filepath.Join(dir, ".d.csv*")); len(ents) != 0 {
				t.Fatalf("temporary files left: %v", ents)
			}
		}
	}
}

// Kinds keeps only the rows asked for, in CSV and DB alike.
func TestOpenKinds(t *testing.T) {
	dir := t.TempDir()
	evs := append(sampleEvents(), manyEvents(2000)...)
	for i := range evs {
		evs[i].ID = uint64(i + 1)
	}
	csvPath := writeFile(t, dir, "k.csv", writeCSV(t, evs))
	dbPath := filepath.Join(dir, "k.db")
	writeDB(t, dbPath, evs)
	kinds := []Kind{KindMalloc, KindMstx}
	var want []Event
	for _, e := range evs {
		if e.Kind == KindMalloc || e.Kind == KindMstx {
			want = append(want, e)
		}
	}
	for _, p := range []string{csvPath, dbPath} {
		got := readPath(t, p, OpenOptions{Kinds: kinds, Reuse: true})
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: %d events with Kinds, want %d", p, len(got), len(want))
		}
	}
}

// Any CSV that csvReader accepts goes through a SQLite dump unchanged.
func FuzzSQLiteRoundTrip(f *testing.F) {
	hdr := strings.Join(CSVHeader, ",") + "\n"
	f.Add(writeCSV(f, sampleEvents()))
	f.Add([]byte(hdr + "1,MSTX,Mark,\"a\"\"b\",1,-1,1,N/A,N/A,{id:7},\"x\ny\",N/A\r\n"))
	f.Add([]byte(hdr + "1,ACCESS,READ,aten::add,1,1,1,0,N/A,\"{dtype:float,size:8,allocation_id:3,size:9}\",N/A,N/A\n"))
	dir := f.TempDir()
	n := 0
	f.Fuzz(func(t *testing.T, data []byte) {
		evs, err := readAll(t, data, "x.csv")
		if err != nil || len(evs) == 0 {
			return
		}
		for i := range evs { // a dump's IDs ascend (the DB's key, its order)
			if evs[i].ID > 1<<63-1 || (i > 0 && evs[i].ID <= evs[i-1].ID) {
				return
			}
		}
		n++
		p := filepath.Join(dir, fmt.Sprintf("f%d.db", n))
		writeDB(t, p, evs)
		defer os.Remove(p)
		for _, lean := range []bool{false, true} {
			got := readPath(t, p, OpenOptions{Lean: lean})
			want := evs
			if lean {
				want = leanOf(evs)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("lean=%v: DB gives\n%+v\nwant\n%+v", lean, got, want)
			}
		}
	})
}
