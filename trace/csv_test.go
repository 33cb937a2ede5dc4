package trace

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// sampleEvents covers every column rule and the quoting cases.
func sampleEvents() []Event {
	return []Event{
		{ID: 1, Kind: KindSystem, Type: TypeStart, Timestamp: 812345000100, Pid: 4242, Tid: 4242},
		{ID: 2, Kind: KindMstx, Type: TypeRangeStart, Name: StepRangeMessage, Timestamp: 812345001000, Pid: 4242, Tid: 4242, MstxID: 1},
		{ID: 3, Kind: KindMalloc, Type: TypeHost, Timestamp: 812345001500, Pid: 4242, Tid: 4242, Device: DeviceHost,
			Ptr: 0x55d0c2a0, HasPtr: true, AllocID: 1, Size: 4096, Owner: "HOST",
			CStack: "load_batch data.c:41 (train);main train.c:88 (train)"},
		{ID: 4, Kind: KindMalloc, Type: TypePTA, Timestamp: 812345002000, Pid: 4242, Tid: 4250, Device: DeviceHost,
			Ptr: 0x7f31c0000040, HasPtr: true, AllocID: 2, Size: 1048576, Owner: "PTA@model@weight",
			Inefficient: "early_allocation|temporary_idleness", Shadow: true,
			Extra:   []KV{{"total", "1048576"}, {"used", "1048576"}},
			PyStack: "model.py:12(__init__);train.py:30(<module>)"},
		{ID: 5, Kind: KindFree, Type: TypeHost, Timestamp: 812345003000, Pid: 4242, Tid: 4242, Device: DeviceHost,
			Ptr: 0x55d0c2a0, HasPtr: true, AllocID: 1, Size: 4096},
		{ID: 6, Kind: KindAccess, Type: "READ", Name: "aten::add", Timestamp: 812345003500, Pid: 4242, Tid: 4242, Device: "0",
			AllocID: 2, Size: 24, Extra: []KV{{"dtype", "float"}, {"shape", "[2x3]"}, {"size", "24"}, {"allocation_id", "2"}}},
		{ID: 7, Kind: KindOpLaunch, Type: "ATEN_START", Name: `weird "op", with comma`, Timestamp: 812345003600, Pid: -1, Tid: 7,
			Device: " 0", PyStack: `a.py:1(f);b.py:2("g", h);c.py:3(i)`, CStack: "f\nline two\r\n;g"},
		{ID: 8, Kind: KindMstx, Type: TypeRangeEnd, Name: " leading space", Timestamp: 812345004000, Pid: 4242, Tid: 4242, MstxID: 1},
		{ID: 9, Kind: KindSnapshot, Type: NA, Timestamp: 9, Pid: 1, Tid: 1, Device: "\u00a0nbsp", Extra: []KV{{"rss", "10"}, {"q", `"x"`}}},
		{ID: 10, Kind: KindMstx, Type: TypeMark, Name: `\.`, Timestamp: 10, Pid: 1, Tid: 1, MstxID: 3, CStack: "résumé;ünï"},
		{ID: 11, Kind: KindSystem, Type: TypeStep, Timestamp: 11, Pid: 1, Tid: 1, Extra: []KV{{"k", "v:with:colons"}}},
		{ID: 12, Kind: KindMap, Type: TypeHAL, Timestamp: 12, Pid: 1, Tid: 1, Device: "0", Ptr: 0x7c0000000000, HasPtr: true,
			Extra: []KV{{"size", "2097152"}, {"offset", "0"}, {"handle", "0x1000"}}},
		{ID: 13, Kind: KindUnmap, Type: TypeHAL, Timestamp: 13, Pid: 1, Tid: 1, Device: "0", Ptr: 0x7c0000000000, HasPtr: true,
			Extra: []KV{{"size", "2097152"}, {"handle", "0x1000"}}},
	}
}

// expectedFields is the row CSVWriter must write for e, field by field.
func expectedFields(e *Event) []string {
	na := func(s string) string {
		if s == "" {
			return NA
		}
		return s
	}
	p := NA
	if e.HasPtr {
		p = fmt.Sprintf("0x%x", e.Ptr)
	}
	return []string{strconv.FormatUint(e.ID, 10), e.Kind.String(), e.Type, na(e.Name),
		strconv.FormatUint(e.Timestamp, 10), strconv.FormatInt(e.Pid, 10), strconv.FormatInt(e.Tid, 10),
		na(e.Device), p, e.Attr(), na(e.PyStack), na(e.CStack)}
}

func writeCSV(t testing.TB, evs []Event) []byte {
	var buf bytes.Buffer
	w := NewCSVWriter(&buf)
	for i := range evs {
		if err := w.Write(&evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if w.Rows() != uint64(len(evs)) {
		t.Fatalf("Rows() = %d, want %d", w.Rows(), len(evs))
	}
	return buf.Bytes()
}

func TestCSVWriterMatchesEncodingCSV(t *testing.T) {
	evs := sampleEvents()
	got := writeCSV(t, evs)

	var want bytes.Buffer
	cw := csv.NewWriter(&want)
	cw.Write(CSVHeader)
	var rows [][]string
	for i := range evs {
		f := expectedFields(&evs[i])
		rows = append(rows, f)
		cw.Write(f)
	}
	cw.Flush()
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("output differs from encoding/csv:\ngot:\n%s\nwant:\n%s", got, want.Bytes())
	}

	cr := csv.NewReader(bytes.NewReader(got))
	all, err := cr.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(all[0], CSVHeader) {
		t.Fatalf("header = %q", all[0])
	}
	for i, row := range all[1:] {
		want := rows[i]
		// encoding/csv's reader turns "\r\n" inside a quoted field into "\n".
		want[colCStack] = strings.ReplaceAll(want[colCStack], "\r\n", "\n")
		if !reflect.DeepEqual(row, want) {
			t.Errorf("row %d parsed as %q, want %q", i+1, row, want)
		}
	}
	if !strings.Contains(string(got), `"a.py:1(f);b.py:2(""g"", h);c.py:3(i)"`) {
		t.Errorf("python stack not quoted as expected:\n%s", got)
	}
}

func TestCSVWriterHeaderOnly(t *testing.T) {
	got := string(writeCSV(t, nil))
	want := strings.Join(CSVHeader, ",") + "\n"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestCSVWriterNeedsQuotes(t *testing.T) {
	for _, s := range []string{"", "a", " a", "\ta", "a ", "a,b", `a"b`, "a\nb", "a\rb", `\.`, `\.x`, "\u00a0x", "\u0085x", "\u2028x", "é"} {
		var want bytes.Buffer
		cw := csv.NewWriter(&want)
		cw.Write([]string{s, "x"})
		cw.Flush()
		got := string(appendCSVField(nil, s)) + ",x\n"
		if got != want.String() {
			t.Errorf("field %q: got %q, want %q", s, got, want.String())
		}
	}
}

func readAll(t testing.TB, data []byte, name string) ([]Event, error) {
	r, err := newCSVReader(bytes.NewReader(data), name)
	if err != nil {
		return nil, err
	}
	var evs []Event
	for {
		e, err := r.Next()
		if err != nil {
			return evs, err
		}
		if e == nil {
			return evs, nil
		}
		evs = append(evs, *e)
	}
}

func TestCSVRoundTrip(t *testing.T) {
	evs := sampleEvents()
	data := writeCSV(t, evs)
	got, err := readAll(t, data, "dump.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(evs) {
		t.Fatalf("read %d events, want %d", len(got), len(evs))
	}
	for i := range evs {
		if !reflect.DeepEqual(got[i], evs[i]) {
			t.Errorf("event %d:\n got %+v\nwant %+v", i+1, got[i], evs[i])
		}
	}
	// The same file with CRLF line ends, a BOM and blank lines reads the same.
	crlf := strings.ReplaceAll(string(data), "\n", "\r\n")
	crlf = strings.Replace(crlf, "f\r\nline two\r\r\n;g", "f\nline two\r\n;g", 1) // keep the quoted field's bytes
	crlf = "\uFEFF" + strings.Replace(crlf, "\r\n", "\r\n\r\n\n", 3)
	got2, err := readAll(t, []byte(crlf), "crlf.csv")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got2, got) {
		t.Errorf("CRLF file reads differently:\n%+v\n%+v", got2, got)
	}
}

func TestCSVReaderSpec(t *testing.T) {
	// The illustration of SPEC §2.1.
	const dump = `ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)
1,SYSTEM,START,N/A,812345000100,4242,4242,N/A,N/A,{},N/A,N/A
2,MSTX,Range_start,step start,812345001000,4242,4242,N/A,N/A,{id:1},N/A,N/A
3,MALLOC,HOST,N/A,812345001500,4242,4242,host,0x55d0c2a0,"{allocation_id:1,addr:0x55d0c2a0,size:4096,owner:HOST}",N/A,"load_batch data.c:41 (train);main train.c:88 (train)"
4,MALLOC,PTA,N/A,812345002000,4242,4250,host,0x7f31c0000040,"{allocation_id:2,addr:0x7f31c0000040,size:1048576,owner:PTA@model@weight,total:1048576,used:1048576}","model.py:12(__init__);train.py:30(<module>)",N/A
5,FREE,HOST,N/A,812345003000,4242,4242,host,0x55d0c2a0,"{allocation_id:1,addr:0x55d0c2a0,size:4096}",N/A,N/A
6,MSTX,Range_end,step start,812345004000,4242,4242,N/A,N/A,{id:1},N/A,N/A
`
	evs, err := readAll(t, []byte(dump), "spec.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 6 {
		t.Fatalf("%d events", len(evs))
	}
	e := evs[3]
	if e.Kind != KindMalloc || e.Type != TypePTA || e.AllocID != 2 || e.Ptr != 0x7f31c0000040 || !e.HasPtr ||
		e.Size != 1048576 || e.Owner != "PTA@model@weight" || e.Name != "" || e.CStack != "" ||
		e.PyStack != "model.py:12(__init__);train.py:30(<module>)" || e.Device != "host" || e.Tid != 4250 {
		t.Errorf("row 4 = %+v", e)
	}
	if v, _ := e.Get("used"); v != "1048576" {
		t.Errorf("used = %q", v)
	}
	if evs[1].MstxID != 1 || evs[1].Name != StepRangeMessage || evs[1].HasPtr || evs[1].Device != "" {
		t.Errorf("row 2 = %+v", evs[1])
	}
	// Writing what was read gives the file back, except that the stacks are
	// quoted only where needed (the illustration quotes them anyway).
	want := strings.NewReplacer(`"load_batch data.c:41 (train);main train.c:88 (train)"`, `load_batch data.c:41 (train);main train.c:88 (train)`,
		`"model.py:12(__init__);train.py:30(<module>)"`, `model.py:12(__init__);train.py:30(<module>)`).Replace(dump)
	if out := writeCSV(t, evs); string(out) != want {
		t.Errorf("rewrite differs:\n%s", out)
	}
}

func TestCSVReaderHeaderErrors(t *testing.T) {
	hdr := strings.Join(CSVHeader, ",")
	for _, tc := range []struct{ header, want string }{
		{"", "h.csv:1: empty file"},
		{strings.Replace(hdr, ",Attr,", ",Attrs,", 1), `h.csv:1: header: missing column "Attr" (column 10 is "Attrs")`},
		{strings.Replace(hdr, ",Ptr", "", 1), `h.csv:1: header: missing column "Ptr"`},
		{strings.Replace(hdr, ",Call Stack(C)", "", 1), `h.csv:1: header: missing column "Call Stack(C)"`},
		{strings.Replace(hdr, "Process Id,Thread Id", "Thread Id,Process Id", 1), `h.csv:1: header: column 6 is "Thread Id", want "Process Id"`},
		{hdr + ",More", `h.csv:1: header: unexpected column 13 "More"`},
		{`"ID,Event`, "h.csv:1: truncated last line: unterminated quoted field 1"},
	} {
		_, err := newCSVReader(strings.NewReader(tc.header+"\n"), "h.csv")
		if tc.header == "" {
			_, err = newCSVReader(strings.NewReader(""), "h.csv")
		}
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("header %q: error %v, want prefix %q", tc.header, err, tc.want)
		}
	}
	if _, err := newCSVReader(strings.NewReader(" "+strings.ReplaceAll(hdr, ",", ", ")+"\n"), "h.csv"); err != nil {
		t.Errorf("spaces around header names: %v", err)
	}
}

func TestCSVReaderErrors(t *testing.T) {
	hdr := strings.Join(CSVHeader, ",") + "\n"
	ok := "1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n"
	for _, tc := range []struct{ body, want string }{
		{"x,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n", `d.csv:3: bad ID "x"`},
		{"-1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n", `d.csv:3: bad ID "-1"`},
		{"2,SYSTEMX,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n", `d.csv:3: unknown Event kind "SYSTEMX"`},
		{"2,SYSTEM,START,N/A,t,1,1,N/A,N/A,{},N/A,N/A\n", `d.csv:3: bad Timestamp(ns) "t"`},
		{"2,SYSTEM,START,N/A,1,p,1,N/A,N/A,{},N/A,N/A\n", `d.csv:3: bad Process Id "p"`},
		{"2,SYSTEM,START,N/A,1,1,,N/A,N/A,{},N/A,N/A\n", `d.csv:3: bad Thread Id ""`},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,12,{},N/A,N/A\n", `d.csv:3: bad Ptr "12"`},
		{`2,MALLOC,HOST,N/A,1,1,1,host,0x10,"{allocation_id:1,addr:0x10,size:12k}",N/A,N/A` + "\n", `d.csv:3: malformed Attr "{allocation_id:1,addr:0x10,size:12k}": bad size "12k"`},
		{`2,MALLOC,HOST,N/A,1,1,1,host,0x10,"{allocation_id:1,addr:0x10}",N/A,N/A` + "\n", `d.csv:3: malformed Attr "{allocation_id:1,addr:0x10}": MALLOC without size`},
		{`2,MALLOC,HOST,N/A,1,1,1,host,0x11,"{allocation_id:1,addr:0x10,size:1}",N/A,N/A` + "\n", `d.csv:3: Attr addr 0x10 does not match Ptr "0x11"`},
		{`2,FREE,HOST,N/A,1,1,1,host,N/A,"{allocation_id:1,addr:0x10,size:1}",N/A,N/A` + "\n", `d.csv:3: Attr addr 0x10 does not match Ptr "N/A"`},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,a:b,N/A,N/A\n", `d.csv:3: malformed Attr "a:b": missing braces`},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{ab},N/A,N/A\n", `d.csv:3: malformed Attr "{ab}": pair "ab" without ':'`},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{:b},N/A,N/A\n", `d.csv:3: malformed Attr "{:b}": empty key in ":b"`},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A\n", "d.csv:3: wrong number of fields: 11, want 12"},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/A,x\n", "d.csv:3: wrong number of fields: 13, want 12"},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/", "d.csv:3: truncated last line: 11 fields, want 12"},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,\"a;b", "d.csv:3: truncated last line: unterminated quoted field 12"},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,\"a\nb;\nc", "d.csv:3: truncated last line: unterminated quoted field 12"},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,a\"b\n", "d.csv:3: bare \" in non-quoted field 12"},
		{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},\"N/A\"x,N/A\n", "d.csv:3: extraneous or missing \" in quoted field 11"},
		{"\n\n2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A\n", "d.csv:5: wrong number of fields"},
		{"2,SYSTEM,START,\"multi\nline\",1,1,1,N/A,N/A,{},N/A,N/A\n3,FREE,HOST,N/A,1,1,1,N/A,N/A,{},N/A,N/A\n", "d.csv:5: malformed Attr \"{}\": FREE without allocation_id"},
	} {
		_, err := readAll(t, []byte(hdr+ok+tc.body), "d.csv")
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("body %q:\nerror %v\n want %q", tc.body, err, tc.want)
			continue
		}
		if strings.ContainsAny(err.Error(), "\n\r") {
			t.Errorf("error is not one line: %q", err)
		}
	}
	// The writer ends every row with a newline: a last line without one,
	// even with every field, was cut (here inside "N/A", or after it).
	for _, last := range []string{"2,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,N/", strings.TrimSuffix(ok, "\n")} {
		_, err := readAll(t, []byte(hdr+ok+last), "d.csv")
		if err == nil || !strings.HasPrefix(err.Error(), "d.csv:3: truncated last line") || !strings.HasSuffix(err.Error(), "(the file is cut short or damaged)") {
			t.Errorf("final line %q without newline: %v", last, err)
		}
	}
}

func TestCSVReaderLongLine(t *testing.T) {
	long := strings.Repeat("frame (lib+0x1);", 200000) // 3.2 MB, more than the read buffer
	evs := []Event{{ID: 1, Kind: KindSystem, Type: TypeStart, CStack: long, PyStack: `q"` + long}}
	got, err := readAll(t, writeCSV(t, evs), "long.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].CStack != long || got[0].PyStack != `q"`+long {
		t.Fatal("long stacks not read back")
	}
}

// manyEvents makes n rows that look like a real capture: mostly HOST mallocs
// and frees with C stacks.
func manyEvents(n int) []Event {
	stacks := []string{
		"load_batch data.c:41 (train);main train.c:88 (train);__libc_start_main (libc.so.6+0x29d90)",
		"model.py:12(__init__);train.py:30(<module>)",
		"",
	}
	evs := make([]Event, n)
	for i := range evs {
		e := &evs[i]
		e.ID = uint64(i + 1)
		e.Timestamp = 812345000000 + uint64(i)*37
		e.Pid, e.Tid = 4242, 4242+int64(i%3)
		e.Device = DeviceHost
		e.AllocID = uint64(i/2 + 1)
		e.Ptr, e.HasPtr = 0x55d0c2a00000+uint64(i/2)*64, true
		e.Size = uint64(64 + i%4096)
		e.Type = TypeHost
		if i%2 == 0 {
			e.Kind = KindMalloc
			e.Owner = "HOST"
			e.CStack = stacks[i%3]
		} else {
			e.Kind = KindFree
		}
	}
	return evs
}

func BenchmarkCSVWriter(b *testing.B) {
	evs := manyEvents(1 << 14)
	w := NewCSVWriter(io.Discard)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := w.Write(&evs[i&(len(evs)-1)]); err != nil {
			b.Fatal(err)
		}
	}
	w.Flush()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

func BenchmarkCSVReader(b *testing.B) {
	data := writeCSV(b, manyEvents(1<<16))
	b.SetBytes(int64(len(data)) >> 16)
	b.ReportAllocs()
	b.ResetTimer()
	rows := 0
	for rows < b.N {
		r, err := newCSVReader(bytes.NewReader(data), "bench.csv")
		if err != nil {
			b.Fatal(err)
		}
		for rows < b.N {
			e, err := r.Next()
			if err != nil {
				b.Fatal(err)
			}
			if e == nil {
				break
			}
			rows++
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

func FuzzCSVReader(f *testing.F) {
	hdr := strings.Join(CSVHeader, ",") + "\n"
	f.Add(writeCSV(f, sampleEvents()))
	f.Add([]byte(hdr))
	f.Add([]byte(""))
	f.Add([]byte(hdr + "1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4,owner:HOST,x:y}\",N/A,\"a;b\"\n"))
	f.Add([]byte(hdr + "1,FREE,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:4}\",N/A,N/A"))
	f.Add([]byte(hdr + "1,MSTX,Mark,\"a\"\"b\",1,-1,1,N/A,N/A,{id:7},\"x\ny\",N/A\r\n"))
	f.Add([]byte(hdr + "1,ACCESS,READ,aten::add,1,1,1,0,N/A,\"{dtype:float,size:8,allocation_id:3}\",N/A,N/A\n"))
	f.Add([]byte(hdr + "1,SYSTEM,START,N/A,1,1,1,N/A,N/A,{},N/A,\"unterminated\n"))
	// Tiny buffers: cheap executions, and every row takes the long-line paths.
	saved := csvBufSize
	csvBufSize = 16
	f.Cleanup(func() { csvBufSize = saved })
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := newCSVReader(bytes.NewReader(data), "fuzz.csv")
		if err != nil {
			checkOneLine(t, err)
			return
		}
		for range 1000 {
			e, err := r.Next()
			if err != nil {
				checkOneLine(t, err)
				if e2, err2 := r.Next(); e2 != nil || err2 == nil {
					t.Fatalf("error not sticky: %v then %v", err, err2)
				}
				return
			}
			if e == nil {
				return
			}
			// A parsed event writes and reads back to itself, and the second
			// write is byte-identical to the first.
			out := writeCSV(t, []Event{*e})
			back, err := readAll(t, out, "rewrite.csv")
			if err != nil {
				t.Fatalf("rewritten row does not parse: %v\n%s", err, out)
			}
			if len(back) != 1 || !reflect.DeepEqual(back[0], *e) {
				t.Fatalf("round trip changed the event:\n got %+v\nwant %+v", back, *e)
			}
			if out2 := writeCSV(t, back); !bytes.Equal(out, out2) {
				t.Fatalf("second rewrite differs:\n%q\n%q", out, out2)
			}
		}
	})
}

func checkOneLine(t *testing.T, err error) {
	t.Helper()
	s := err.Error()
	if strings.ContainsAny(s, "\n\r") || !strings.HasPrefix(s, "fuzz.csv:") {
		t.Fatalf("bad error message %q", s)
	}
}

// The writer's fast paths (ids and stamps past a million, the Process Id
// kept between rows, a MALLOC's or FREE's Attr written directly) give what
// encoding/csv gives, and so do the cases that leave them.
func TestCSVWriterFastPathsMatchEncodingCSV(t *testing.T) {
	evs := []Event{
		{ID: 999_999, Kind: KindMalloc, Type: TypeHost, Timestamp: 33815921999999, Pid: 4242, Tid: 4243, Device: DeviceHost,
			Ptr: 0x7f9e4c000b70, HasPtr: true, AllocID: 999_999, Size: 462, Owner: "HOST"},
		{ID: 1_000_000, Kind: KindFree, Type: TypeHost, Timestamp: 33815922000000, Pid: 4242, Tid: 4242, Device: DeviceHost,
			Ptr: 0x7f9e4c000b70, HasPtr: true, AllocID: 999_999, Size: 462},
		{ID: 1_000_001, Kind: KindMalloc, Type: TypeMmap, Timestamp: 33815922000001, Pid: 7, Tid: 7, Device: DeviceHost,
			Ptr: 0, HasPtr: true, AllocID: 1_000_000, Size: 0, Owner: `HOST@"quoted"`, Inefficient: "early_allocation"},
		{ID: 1_000_002, Kind: KindMalloc, Type: TypeHost, Timestamp: 5, Pid: 7, Tid: 8, Device: DeviceHost,
			AllocID: 3, Size: 1, Owner: "HOST", Shadow: true},
		{ID: 1_000_003, Kind: KindMalloc, Type: TypeHost, Timestamp: 6, Pid: 7, Tid: 8, Device: DeviceHost,
			Ptr: 0xabc, HasPtr: true, AllocID: 5, Size: 1, Owner: "HOST", Shadow: true},
		{ID: 2_000_000, Kind: KindMalloc, Type: TypeHost, Timestamp: 33815923000000, Pid: -4, Tid: 8, Device: DeviceHost,
			Ptr: 1, HasPtr: true, AllocID: 4, Size: 1 << 40, Owner: "HOST", Extra: []KV{{"k", "v"}, {"say", `"hi"`}}},
		{ID: 2_000_001, Kind: KindFree, Type: TypeHost, Timestamp: 33815923000001, Pid: -4, Tid: 8, Device: DeviceHost,
			Ptr: 1, HasPtr: true, AllocID: 4, Size: 1 << 40, Owner: `ignored"`},
		{ID: 2_000_002, Kind: KindSystem, Type: "", Timestamp: 33815923000002, Pid: -4, Tid: 8}, // an empty type stays empty
		// Rows of one kind and thread whose name or device changes, and a
		// kind whose cache slot another kind has.
		{ID: 2_000_003, Kind: KindOpLaunch, Type: "ATEN", Name: "aten::add", Timestamp: 33815923000003, Pid: -4, Tid: 8, Device: "cuda:0"},
		{ID: 2_000_004, Kind: KindOpLaunch, Type: "ATEN", Name: "aten::mul", Timestamp: 33815923000004, Pid: -4, Tid: 8, Device: "cuda:1"},
		{ID: 2_000_005, Kind: Kind(17), Type: "X", Name: "y", Timestamp: 33815923000005, Pid: -4, Tid: 8},
		{ID: 2_000_006, Kind: KindSystem, Type: "X", Name: "y", Timestamp: 33815923000006, Pid: -4, Tid: 8},
	}
	got := writeCSV(t, evs)
	var want bytes.Buffer
	cw := csv.NewWriter(&want)
	cw.Write(CSVHeader)
	for i := range evs {
		cw.Write(expectedFields(&evs[i]))
	}
	cw.Flush()
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("output differs from encoding/csv:\ngot:\n%s\nwant:\n%s", got, want.Bytes())
	}
}
