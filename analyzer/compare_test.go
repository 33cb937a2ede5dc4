package analyzer

import (
	"bytes"
	"math/rand"
	"strings"
	"testing"

	"msmemscope/trace"
)

// stepCapture is one training step: each operator allocates its output
// (and the second relu some scratch it frees); extra[i] more bytes are
// allocated, never freed, by operator i; insert names an operator run
// after the first one. The first three operators are step 1, the others
// step 2.
func stepCapture(extra map[int]uint64, insert string) *capBuilder {
	c := newCap()
	c.malloc("HOST", 999) // before the first launch: belongs to none
	ops := []string{"aten::linear", "aten::relu", "aten::linear", "aten::relu", "aten::softmax"}
	step := func(typ string, id uint64) {
		c.add(trace.Event{Kind: trace.KindMstx, Type: typ, Name: trace.StepRangeMessage, MstxID: id})
	}
	step(trace.TypeRangeStart, 1)
	for i, op := range ops {
		if i == 3 {
			step(trace.TypeRangeEnd, 1)
			step(trace.TypeRangeStart, 2)
		}
		c.opStart(op)
		out := c.malloc("PTA", 4096)
		if op == "aten::relu" {
			tmp := c.malloc("PTA", 512)
			c.free(tmp)
		}
		if n := extra[i]; n > 0 {
			c.malloc("PTA", n)
		}
		c.opEnd(op)
		_ = out
		if i == 0 && insert != "" {
			c.opStart(insert)
			c.malloc("PTA", 64)
			c.opEnd(insert)
		}
	}
	return c
}

func compareFiles(t *testing.T, a, b string) *CompareReport {
	t.Helper()
	cm := NewComparer()
	var seqs []*LaunchSeq
	for _, p := range []string{a, b} {
		in, err := trace.Open(p, trace.OpenOptions{Lean: true})
		if err != nil {
			t.Fatal(err)
		}
		s, err := cm.Launches(in, p)
		in.Close()
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	r, err := cm.Compare(seqs[0], seqs[1])
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestComparePlanted(t *testing.T) {
	dir := t.TempDir()
	baseCSV, baseDB := stepCapture(nil, "").write(t, dir, "base")
	cmpCSV, cmpDB := stepCapture(map[int]uint64{3: 8192}, "aten::dropout").write(t, dir, "cmp")
	// The compared run inserts dropout second: its later launches' indexes
	// are one more; the planted 8192 bytes are the second relu, in step 2.
	want := "Event,Name,Device Id,Base Allocated Memory(byte),Compare Allocated Memory(byte),Diff Memory(byte),Base Index,Compare Index,Base Step,Compare Step\n" +
		"OP_LAUNCH,aten::relu,host,4096,12288,8192,4,5,2,2\n" +
		"OP_LAUNCH,aten::dropout,host,N/A,64,64,N/A,2,N/A,1\n" +
		"OP_LAUNCH,aten::linear,host,4096,4096,0,1,1,1,1\n" +
		"OP_LAUNCH,aten::relu,host,4096,4096,0,2,3,1,1\n" +
		"OP_LAUNCH,aten::linear,host,4096,4096,0,3,4,1,1\n" +
		"OP_LAUNCH,aten::softmax,host,4096,4096,0,5,6,2,2\n"
	for _, pair := range [][2]string{{baseCSV, cmpCSV}, {baseDB, cmpDB}, {baseCSV, cmpDB}} {
		r := compareFiles(t, pair[0], pair[1])
		var buf bytes.Buffer
		if err := r.WriteCSV(&buf); err != nil {
			t.Fatal(err)
		}
		if buf.String() != want {
			t.Fatalf("%v:\n%s\nwant\n%s", pair, buf.String(), want)
		}
		if r.Matched != 5 || r.CompareOnly != 1 || r.BaseOnly != 0 || r.DifferentCount != 1 {
			t.Fatalf("counts %+v", r)
		}
		s := r.Summary(3)
		if !strings.Contains(s, "aten::relu") || !strings.Contains(s, "+8192") || !strings.Contains(s, "1 only in compare") {
			t.Fatalf("summary:\n%s", s)
		}
	}
	// Swapped: the inserted launch is N/A on the compare side.
	r := compareFiles(t, cmpCSV, baseCSV)
	var buf bytes.Buffer
	r.WriteCSV(&buf)
	if !strings.Contains(buf.String(), "OP_LAUNCH,aten::relu,host,12288,4096,-8192,5,4,2,2\nOP_LAUNCH,aten::dropout,host,64,N/A,-64,2,N/A,1,N/A\n") {
		t.Fatalf("swapped:\n%s", buf.String())
	}
}

// With step() calls, they are the step source, not the mstx ranges.
func TestCompareStepCalls(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for _, name := range []string{"a", "b"} {
		c := newCap()
		for i, op := range []string{"aten::add", "aten::add", "aten::add"} {
			c.opStart(op)
			c.malloc("PTA", uint64(4096*(i+1)))
			c.opEnd(op)
			c.add(trace.Event{Kind: trace.KindSystem, Type: trace.TypeStep})
		}
		c.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeRangeStart, Name: trace.StepRangeMessage, MstxID: 9})
		c.opStart("aten::mul")
		c.malloc("PTA", 64)
		p, _ := c.write(t, dir, name)
		paths = append(paths, p)
	}
	r := compareFiles(t, paths[0], paths[1])
	var buf bytes.Buffer
	r.WriteCSV(&buf)
	want := "OP_LAUNCH,aten::add,host,4096,4096,0,1,1,1,1\nOP_LAUNCH,aten::add,host,8192,8192,0,2,2,2,2\n" +
		"OP_LAUNCH,aten::add,host,12288,12288,0,3,3,3,3\nOP_LAUNCH,aten::mul,host,64,64,0,4,4,4,4\n"
	if !strings.HasSuffix(buf.String(), want) {
		t.Fatalf("got\n%s\nwant the rows\n%s", buf.String(), want)
	}
}

func TestCompareNoLaunches(t *testing.T) {
	dir := t.TempDir()
	c := newCap()
	c.malloc("HOST", 10)
	a, _ := c.write(t, dir, "a")
	b, _ := stepCapture(nil, "").write(t, dir, "b")
	cm := NewComparer()
	ia, _ := trace.Open(a, trace.OpenOptions{})
	sa, _ := cm.Launches(ia, a)
	ia.Close()
	ib, _ := trace.Open(b, trace.OpenOptions{})
	sb, _ := cm.Launches(ib, b)
	ib.Close()
	if _, err := cm.Compare(sa, sb); err == nil || !strings.Contains(err.Error(), "no launches to compare in "+a) {
		t.Fatalf("no launches: %v", err)
	}
}

// lcsLen is the longest common subsequence's length by dynamic programming.
func lcsLen(a, b []byte) int {
	dp := make([][]int, len(a)+1)
	for i := range dp {
		dp[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				dp[i][j] = 1 + dp[i+1][j+1]
			} else {
				dp[i][j] = max(dp[i+1][j], dp[i][j+1])
			}
		}
	}
	return dp[0][0]
}

// checkAlign checks that Align's output is a valid alignment of a and b
// with as many matches as a longest common subsequence (a minimal edit
// script).
func checkAlign(t *testing.T, a, b []byte) {
	t.Helper()
	pairs := Align(a, b)
	ia, ib, matches := 0, 0, 0
	for _, p := range pairs {
		switch {
		case p.A >= 0 && p.B >= 0:
			if p.A != ia || p.B != ib || a[p.A] != b[p.B] {
				t.Fatalf("%q %q: bad match %v at %d,%d", a, b, p, ia, ib)
			}
			ia++
			ib++
			matches++
		case p.A >= 0:
			if p.A != ia {
				t.Fatalf("%q %q: bad deletion %v at %d", a, b, p, ia)
			}
			ia++
		case p.B >= 0:
			if p.B != ib {
				t.Fatalf("%q %q: bad insertion %v at %d", a, b, p, ib)
			}
			ib++
		default:
			t.Fatalf("empty pair")
		}
	}
	if ia != len(a) || ib != len(b) {
		t.Fatalf("%q %q: alignment covers %d,%d", a, b, ia, ib)
	}
	if want := lcsLen(a, b); matches != want {
		t.Fatalf("%q %q: %d matches, LCS is %d: not minimal", a, b, matches, want)
	}
}

func TestAlignRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for range 3000 {
		a := make([]byte, rng.Intn(30))
		b := make([]byte, rng.Intn(30))
		alpha := 1 + rng.Intn(4)
		for i := range a {
			a[i] = byte('a' + rng.Intn(alpha))
		}
		for i := range b {
			b[i] = byte('a' + rng.Intn(alpha))
		}
		checkAlign(t, a, b)
	}
	// A long sequence with a few edits stays fast (O((N+M)D)).
	long := make([]int32, 200000)
	for i := range long {
		long[i] = int32(i % 1000)
	}
	other := append([]int32(nil), long[:100000]...)
	other = append(other, 5000)
	other = append(other, long[100001:]...)
	pairs := Align(long, other)
	if len(pairs) != len(long)+1 {
		t.Fatalf("long: %d pairs", len(pairs))
	}
}

func FuzzAlign(f *testing.F) {
	f.Add([]byte("abcabba"), []byte("cbabac"))
	f.Add([]byte(""), []byte("x"))
	f.Add([]byte("aaaa"), []byte("aa"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if len(a) > 64 || len(b) > 64 {
			return
		}
		checkAlign(t, a, b)
	})
}
