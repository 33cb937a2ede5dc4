package spool

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"msmemscope/format"
	"os"
	"reflect"
	"testing"
)

// The decoder against real CPython code objects (testdata made by
// python/tests/gen_linetables.py): every instruction's line as the
// interpreter gives it, and the ranges of co_lines(). 3.10 has its own
// table format; 3.11 and 3.13 (3.12 lies between) share one, but from 3.12
// on co_lines() merges neighbouring ranges of one line (merged).
func TestPyLineTables(t *testing.T) {
	for _, c := range []struct {
		file      string
		format    uint16
		merged    bool
		minInstrs int // 3.10 has no inline caches: fewer code units
	}{
		{"testdata/py310_linetables.json", format.PyLTPEP626, false, 5000},
		{"testdata/py311_linetables.json", format.PyLTLocations, false, 10000},
		{"testdata/py313_linetables.json", format.PyLTLocations, true, 10000},
	} {
		t.Run(c.file, func(t *testing.T) { testLineTables(t, c.file, c.format, c.merged, c.minInstrs) })
	}
}

// mergeLines joins neighbouring ranges of one line, as co_lines() does from
// CPython 3.12 on.
func mergeLines(in [][3]int) [][3]int {
	var out [][3]int
	for _, r := range in {
		if n := len(out); n > 0 && out[n-1][1] == r[0] && out[n-1][2] == r[2] {
			out[n-1][1] = r[1]
			continue
		}
		out = append(out, r)
	}
	return out
}

func testLineTables(t *testing.T, file string, ltFormat uint16, merged bool, minInstrs int) {
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Name        string   `json:"name"`
		FirstLineNo int      `json:"firstlineno"`
		LineTable   string   `json:"linetable"`
		Lines       [][3]int `json:"lines"`
		Positions   []int    `json:"positions"`
	}
	if err := json.Unmarshal(b, &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 100 {
		t.Fatalf("only %d code objects", len(rows))
	}
	instrs := 0
	for _, r := range rows {
		lt, err := hex.DecodeString(r.LineTable)
		if err != nil {
			t.Fatal(err)
		}
		c := &PyCode{FirstLine: r.FirstLineNo, LineTable: lt, LineTableFormat: ltFormat}
		for i, want := range r.Positions {
			if got := c.Line(i); got != want {
				t.Fatalf("%s: instruction %d: line %d, want %d", r.Name, i, got, want)
			}
			instrs++
		}
		lines := c.Lines()
		if merged {
			lines = mergeLines(lines)
		}
		if len(lines) == 0 && len(r.Lines) == 0 {
			continue
		}
		if !reflect.DeepEqual(lines, r.Lines) {
			t.Fatalf("%s: co_lines\n got %v\nwant %v", r.Name, lines, r.Lines)
		}
	}
	if instrs < minInstrs {
		t.Fatalf("only %d instructions checked", instrs)
	}
	c := &PyCode{FirstLine: 7, LineTableFormat: ltFormat}
	if c.Line(-1) != 7 {
		t.Fatal("a frame not started is on the first line")
	}
}

func TestParsePyCodeAndStacks(t *testing.T) {
	var p []byte
	hdr := make([]byte, pyCodeHdrSz)
	binary.LittleEndian.PutUint32(hdr[0:], 9)
	binary.LittleEndian.PutUint32(hdr[4:], 12)
	binary.LittleEndian.PutUint16(hdr[12:], 4)
	binary.LittleEndian.PutUint16(hdr[14:], 1)
	binary.LittleEndian.PutUint16(hdr[16:], 3)
	binary.LittleEndian.PutUint32(hdr[20:], 2)
	p = append(append(hdr, "m.pyfK.f"...), 0x80|(13<<3), 0x04) // 1 unit, line +2
	c, ok := ParsePyCode(p)
	if !ok || c.ID != 9 || c.File != "m.py" || c.Name != "f" || c.QualName != "K.f" || c.FirstLine != 12 || len(c.LineTable) != 2 {
		t.Fatalf("%+v", c)
	}
	if c.Line(0) != 14 {
		t.Fatalf("line %d", c.Line(0))
	}
	var m PyMeta
	m.note(format.RPyCode, 1, 9, uint64(len(p)), p)
	m.note(format.RPySkip, 2, 0, 4, []byte("/pk/\x00\x00"))
	m.note(format.RConfig, 5, 0, 2, []byte("{}"))
	m.note(format.RConfig, 3, 0, 4, []byte("old!"))
	if m.Config != "{}" {
		t.Fatalf("latest config %q", m.Config)
	}

	// payload: {1 C frame, 2 Python frames}, C frame, frames
	pl := make([]byte, 8*4)
	binary.LittleEndian.PutUint32(pl[0:], 1)
	binary.LittleEndian.PutUint32(pl[4:], 2)
	binary.LittleEndian.PutUint64(pl[8:], 0x401000)
	binary.LittleEndian.PutUint32(pl[16:], 9)
	binary.LittleEndian.PutUint32(pl[20:], 0)
	binary.LittleEndian.PutUint32(pl[24:], 9)
	binary.LittleEndian.PutUint32(pl[28:], 0xffffffff)
	r := &Rec{Flags: format.FPyStack | format.FCStack, Payload: pl}
	cs, py := r.Stacks()
	if !reflect.DeepEqual(cs, []uint64{0x401000}) || !reflect.DeepEqual(py, []PyFrame{{9, 0}, {9, -1}}) {
		t.Fatalf("%v %v", cs, py)
	}
	got := m.FormatPyStack(py, map[PyFrame]int{})
	if got != "m.py:14(f);m.py:12(f)" {
		t.Fatalf("stack %q", got)
	}
	c2 := *c
	c2.ID, c2.File = 10, "/pk/x.py"
	m.Codes[10] = &c2
	if got := m.FormatPyStack([]PyFrame{{10, 0}, {9, 0}, {77, 0}}, map[PyFrame]int{}); got != "m.py:14(f)" {
		t.Fatalf("own frames and unknown codes left out: %q", got)
	}
}
