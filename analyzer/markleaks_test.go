package analyzer

import (
	"bufio"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"msmemscope/trace"
)

// capBuilder plants known situations in a capture, written as a dump CSV
// and as a SQLite dump with the same rows.
type capBuilder struct {
	evs  []trace.Event
	aid  uint64
	size map[uint64]uint64
	typ  map[uint64]string
}

func newCap() *capBuilder {
	c := &capBuilder{size: map[uint64]uint64{}, typ: map[uint64]string{}}
	c.add(trace.Event{Kind: trace.KindSystem, Type: trace.TypeStart})
	return c
}

func (c *capBuilder) add(e trace.Event) uint64 {
	e.ID = uint64(len(c.evs) + 1)
	e.Timestamp = 1_000_000 + e.ID*100
	e.Pid, e.Tid = 4242, 4242
	c.evs = append(c.evs, e)
	return e.ID
}

// malloc allocates a block and returns its allocation id.
func (c *capBuilder) malloc(typ string, size uint64) uint64 {
	c.aid++
	dev := "host"
	if typ == "HAL" {
		dev = "0"
	}
	e := trace.Event{Kind: trace.KindMalloc, Type: typ, Device: dev, Ptr: 0x10000 * c.aid, HasPtr: true,
		AllocID: c.aid, Size: size, Owner: typ, CStack: "alloc_" + typ + " a.c:1 (prog);main a.c:9 (prog)"}
	if typ == "PTA" {
		e.Extra = []trace.KV{{Key: "total", Value: "1048576"}, {Key: "used", Value: "4096"}}
		e.PyStack = "model.py:3(forward);train.py:10(<module>)"
	}
	c.add(e)
	c.size[c.aid], c.typ[c.aid] = size, typ
	return c.aid
}

func (c *capBuilder) mallocID(aid uint64) uint64 {
	for i := range c.evs {
		if c.evs[i].Kind == trace.KindMalloc && c.evs[i].AllocID == aid {
			return c.evs[i].ID
		}
	}
	return 0
}

func (c *capBuilder) free(aid uint64) {
	dev := "host"
	if c.typ[aid] == "HAL" {
		dev = "0"
	}
	c.add(trace.Event{Kind: trace.KindFree, Type: c.typ[aid], Device: dev, Ptr: 0x10000 * aid, HasPtr: true, AllocID: aid, Size: c.size[aid]})
}

func (c *capBuilder) mark(msg string) uint64 {
	return c.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeMark, Name: msg, MstxID: uint64(len(c.evs))})
}

func (c *capBuilder) opStart(name string) {
	c.add(trace.Event{Kind: trace.KindOpLaunch, Type: "ATEN_START", Name: name, Device: "host"})
}

func (c *capBuilder) opEnd(name string) {
	c.add(trace.Event{Kind: trace.KindOpLaunch, Type: "ATEN_END", Name: name, Device: "host"})
}

func (c *capBuilder) access(aid uint64, op string) {
	c.add(trace.Event{Kind: trace.KindAccess, Type: "READ", Name: op, Device: "host", AllocID: aid, Size: c.size[aid],
		Extra: []trace.KV{{Key: "dtype", Value: "float32"}, {Key: "shape", Value: "[4]"}, {Key: "size", Value: "16"},
			{Key: "format", Value: "N/A"}, {Key: "type", Value: "PTA"}, {Key: "allocation_id", Value: itoa(aid)}}})
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// write writes the capture as name.csv and name.db in dir.
func (c *capBuilder) write(t testing.TB, dir, name string) (csvPath, dbPath string) {
	t.Helper()
	csvPath = filepath.Join(dir, name+".csv")
	f, err := os.Create(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	bw := bufio.NewWriter(f)
	w := trace.NewCSVWriter(bw)
	for i := range c.evs {
		if err := w.Write(&c.evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	bw.Flush()
	f.Close()
	dbPath = filepath.Join(dir, name+".db")
	d, err := trace.CreateSQLite(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.evs {
		if err := d.Write(&c.evs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	return csvPath, dbPath
}

func leakIDs(r *MarkLeakReport) []uint64 {
	var ids []uint64
	for _, l := range r.Leaks {
		ids = append(ids, l.AllocID)
	}
	return ids
}

func TestCheckLeaksPlanted(t *testing.T) {
	c := newCap()
	before := c.malloc("HOST", 100)                                                                // before A: out of range
	c.mark("iter")                                                                                 // mark #0
	c.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeRangeStart, Name: "iter", MstxID: 99}) // not a mark
	early := c.malloc("HOST", 7)                                                                   // between #0 and #1: not in range for start_index 1
	a := c.mark("iter")                                                                            // #1 = A
	l1 := c.malloc("HOST", 4096)                                                                   // leak: never freed
	c.mark("other")                                                                                // another message: ignored
	l2 := c.malloc("PTA", 1<<20)                                                                   // leak: freed only after C
	f1 := c.malloc("HOST", 64)                                                                     // freed before B
	c.free(f1)
	f2 := c.malloc("PTA", 128)   // freed between B and C
	l3 := c.malloc("HAL", 2<<20) // leak
	b := c.mark("iter")          // #2 = B
	n := c.malloc("HOST", 9999)  // allocated after B: not a leak
	c.free(f2)
	cm := c.mark("iter") // #3 = C
	c.free(l2)           // after C: still a leak
	c.free(early)
	_ = n
	_ = before
	dir := t.TempDir()
	csvPath, dbPath := c.write(t, dir, "dump")

	var first *MarkLeakReport
	for _, p := range []string{csvPath, dbPath} {
		r, err := CheckLeaks(p, MarkLeakOptions{MstxInfo: "iter", StartIndex: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := leakIDs(r), []uint64{l1, l2, l3}; !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: leaks %v, want %v", p, got, want)
		}
		if r.A.ID != a || r.B.ID != b || r.C.ID != cm {
			t.Fatalf("%s: marks %d %d %d, want %d %d %d", p, r.A.ID, r.B.ID, r.C.ID, a, b, cm)
		}
		if r.Bytes != 4096+(1<<20)+(2<<20) {
			t.Fatalf("%s: leaked bytes %d", p, r.Bytes)
		}
		// Complete rows: call stacks and sizes of the planted blocks.
		l := r.Leaks[1]
		if l.ID != c.mallocID(l2) || l.Size != 1<<20 || l.EventType != "PTA" || l.Owner != "PTA" ||
			l.PyStack != "model.py:3(forward);train.py:10(<module>)" || !strings.HasPrefix(l.CStack, "alloc_PTA") || l.Ptr != "0x"+strconv.FormatUint(0x10000*l2, 16) {
			t.Fatalf("%s: leak %+v", p, l)
		}
		r.Input = ""
		if first == nil {
			first = r
		} else if !reflect.DeepEqual(first, r) {
			t.Fatalf("CSV and DB results differ:\n%+v\n%+v", first, r)
		}
		if !strings.Contains(r.Summary(5), "3 blocks") {
			t.Fatalf("summary: %s", r.Summary(5))
		}
	}
	// event_type narrows the scope.
	for _, p := range []string{csvPath, dbPath} {
		r, err := CheckLeaks(p, MarkLeakOptions{MstxInfo: "iter", StartIndex: 1, EventType: "HAL"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := leakIDs(r); !reflect.DeepEqual(got, []uint64{l3}) {
			t.Fatalf("%s: HAL leaks %v, want [%d]", p, got, l3)
		}
		// start_index 0: A=#0, B=#1, C=#2: only `early` was allocated
		// between #0 and #1, and it is freed after C.
		r, err = CheckLeaks(p, MarkLeakOptions{MstxInfo: "iter", StartIndex: 0}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := leakIDs(r); !reflect.DeepEqual(got, []uint64{early}) {
			t.Fatalf("%s: start_index 0: leaks %v, want [%d]", p, got, early)
		}
		// Not enough marks.
		if _, err := CheckLeaks(p, MarkLeakOptions{MstxInfo: "iter", StartIndex: 2}, nil); err == nil ||
			!strings.Contains(err.Error(), `found 4 MSTX marks with message "iter": start_index 2 needs 5`) {
			t.Fatalf("%s: too few marks: %v", p, err)
		}
		if _, err := CheckLeaks(p, MarkLeakOptions{MstxInfo: "nope", StartIndex: 0}, nil); err == nil {
			t.Fatalf("%s: unknown message gave no error", p)
		}
	}
}

func TestCheckLeaksBadInput(t *testing.T) {
	dir := t.TempDir()
	if _, err := CheckLeaks(dir, MarkLeakOptions{MstxInfo: "x"}, nil); err == nil || ErrorKind(err) != "IsADirectoryError" {
		t.Fatalf("directory: %v (%s)", err, ErrorKind(err))
	}
	if _, err := CheckLeaks(filepath.Join(dir, "none.csv"), MarkLeakOptions{MstxInfo: "x"}, nil); err == nil || ErrorKind(err) != "FileNotFoundError" {
		t.Fatalf("missing: %v", err)
	}
	p := filepath.Join(dir, "bad.csv")
	os.WriteFile(p, []byte(strings.Join(trace.CSVHeader, ",")+"\n1,MALLOC,HOST,N/A,1,1,1,host,0x10,\"{allocation_id:1,addr:0x10,size:ten}\",N/A,N/A\n"), 0o640)
	if _, err := CheckLeaks(p, MarkLeakOptions{MstxInfo: "x"}, nil); err == nil || err.Error() != p+`:2: malformed Attr "{allocation_id:1,addr:0x10,size:ten}": bad size "ten"` {
		t.Fatalf("bad size: %v", err)
	}
}
