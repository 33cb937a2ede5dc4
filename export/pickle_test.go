package export

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// pyTuple is a decoded tuple (a decoded list is []any).
type pyTuple []any

// unpickle decodes what pickler writes (the opcodes it uses, and only
// those) into Go values: map[string]any, []any, pyTuple, string, *big.Int,
// float64, bool, nil. Memoized values are shared, as in Python.
func unpickle(b []byte) (any, error) {
	var stack []any
	var marks []int
	memo := map[uint32]any{}
	i := 0
	need := func(n int) error {
		if i+n > len(b) {
			return fmt.Errorf("cut short at %d", i)
		}
		return nil
	}
	popMark := func() (int, error) {
		if len(marks) == 0 {
			return 0, fmt.Errorf("no mark at %d", i)
		}
		m := marks[len(marks)-1]
		marks = marks[:len(marks)-1]
		return m, nil
	}
	u32 := func() uint32 { v := binary.LittleEndian.Uint32(b[i:]); i += 4; return v }
	// arg reads an opcode's length or memo index: one byte in its short
	// form, else four.
	arg := func(short bool) (uint32, error) {
		if short {
			if err := need(1); err != nil {
				return 0, err
			}
			i++
			return uint32(b[i-1]), nil
		}
		if err := need(4); err != nil {
			return 0, err
		}
		return u32(), nil
	}
	for {
		if err := need(1); err != nil {
			return nil, err
		}
		op := b[i]
		i++
		var err error
		switch op {
		case opProto:
			if err = need(1); err == nil && b[i] != 4 {
				err = fmt.Errorf("protocol %d", b[i])
			}
			i++
		case opStop:
			if len(stack) != 1 || len(marks) != 0 {
				return nil, fmt.Errorf("STOP with stack %d, marks %d", len(stack), len(marks))
			}
			if i != len(b) {
				return nil, fmt.Errorf("%d bytes after STOP", len(b)-i)
			}
			return stack[0], nil
		case opNone:
			stack = append(stack, nil)
		case opNewTrue, opNewFalse:
			stack = append(stack, op == opNewTrue)
		case opBinInt1:
			if err = need(1); err == nil {
				stack = append(stack, big.NewInt(int64(b[i])))
				i++
			}
		case opBinInt2:
			if err = need(2); err == nil {
				stack = append(stack, big.NewInt(int64(binary.LittleEndian.Uint16(b[i:]))))
				i += 2
			}
		case opBinInt:
			if err = need(4); err == nil {
				stack = append(stack, big.NewInt(int64(int32(u32()))))
			}
		case opLong1:
			if err = need(1); err != nil {
				break
			}
			n := int(b[i])
			i++
			if err = need(n); err != nil {
				break
			}
			be := make([]byte, n)
			for k := 0; k < n; k++ {
				be[n-1-k] = b[i+k]
			}
			v := new(big.Int).SetBytes(be)
			if n > 0 && be[0]&0x80 != 0 {
				v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*n)))
			}
			i += n
			stack = append(stack, v)
		case opBinFloat:
			if err = need(8); err == nil {
				stack = append(stack, math.Float64frombits(binary.BigEndian.Uint64(b[i:])))
				i += 8
			}
		case opShortBinStr, opBinUnicode:
			var n uint32
			if n, err = arg(op == opShortBinStr); err == nil {
				if err = need(int(n)); err == nil {
					stack = append(stack, string(b[i:i+int(n)]))
					i += int(n)
				}
			}
		case opEmptyDict:
			stack = append(stack, map[string]any{})
		case opEmptyList:
			stack = append(stack, &[]any{})
		case opEmptyTuple:
			stack = append(stack, pyTuple{})
		case opMark:
			marks = append(marks, len(stack))
		case opTuple1, opTuple2, opTuple3:
			n := int(op-opTuple1) + 1
			if len(stack) < n {
				return nil, fmt.Errorf("tuple of %d on a stack of %d", n, len(stack))
			}
			t := append(pyTuple{}, stack[len(stack)-n:]...)
			stack = append(stack[:len(stack)-n], t)
		case opTuple:
			m, err := popMark()
			if err != nil {
				return nil, err
			}
			t := append(pyTuple{}, stack[m:]...)
			stack = append(stack[:m], t)
		case opAppends, opSetItems:
			m, err := popMark()
			if err != nil {
				return nil, err
			}
			if m == 0 {
				return nil, fmt.Errorf("nothing under the mark at %d", i)
			}
			items := stack[m:]
			if op == opAppends {
				l, ok := stack[m-1].(*[]any)
				if !ok {
					return nil, fmt.Errorf("APPENDS to %T", stack[m-1])
				}
				*l = append(*l, items...)
			} else {
				d, ok := stack[m-1].(map[string]any)
				if !ok || len(items)%2 != 0 {
					return nil, fmt.Errorf("SETITEMS to %T with %d items", stack[m-1], len(items))
				}
				for k := 0; k < len(items); k += 2 {
					key, ok := items[k].(string)
					if !ok {
						return nil, fmt.Errorf("dict key %T", items[k])
					}
					d[key] = items[k+1]
				}
			}
			stack = stack[:m]
		case opBinPut, opLongBinPut:
			var k uint32
			if k, err = arg(op == opBinPut); err == nil {
				if len(stack) == 0 {
					return nil, fmt.Errorf("PUT on an empty stack")
				}
				memo[k] = stack[len(stack)-1]
			}
		case opBinGet, opLongBinGet:
			var k uint32
			if k, err = arg(op == opBinGet); err == nil {
				v, ok := memo[k]
				if !ok {
					return nil, fmt.Errorf("GET %d: not memoized", k)
				}
				stack = append(stack, v)
			}
		default:
			return nil, fmt.Errorf("opcode 0x%02x at %d", op, i-1)
		}
		if err != nil {
			return nil, err
		}
	}
}

// plain turns unpickle's *[]any lists into []any, recursively.
func plain(v any) any {
	switch x := v.(type) {
	case *[]any:
		out := make([]any, len(*x))
		for i, e := range *x {
			out[i] = plain(e)
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			out[k] = plain(e)
		}
		return out
	case pyTuple:
		out := pyTuple{}
		for _, e := range x {
			out = append(out, plain(e))
		}
		return out
	}
	return v
}

func pickleOf(t *testing.T, write func(p *pickler)) []byte {
	t.Helper()
	var b bytes.Buffer
	p := newPickler(&b)
	write(p)
	if err := p.finish(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Integers take Python's encodings: the smallest of BININT1, BININT2,
// BININT, then LONG1 with the fewest two's complement bytes.
func TestPickleIntEncodings(t *testing.T) {
	cases := []struct {
		v    int64
		want string
	}{
		{0, "K\x00"}, {255, "K\xff"}, {256, "M\x00\x01"}, {65535, "M\xff\xff"}, {65536, "J\x00\x00\x01\x00"},
		{-1, "J\xff\xff\xff\xff"}, {math.MaxInt32, "J\xff\xff\xff\x7f"}, {math.MinInt32, "J\x00\x00\x00\x80"},
		{1 << 31, "\x8a\x05\x00\x00\x00\x80\x00"}, {1 << 40, "\x8a\x06\x00\x00\x00\x00\x00\x01"},
		{-(1 << 40), "\x8a\x06\x00\x00\x00\x00\x00\xff"}, {math.MinInt32 - 1, "\x8a\x05\xff\xff\xff\x7f\xff"},
		{math.MaxInt64, "\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"}, {math.MinInt64, "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"},
	}
	for _, c := range cases {
		got := pickleOf(t, func(p *pickler) { p.int(c.v) })
		if want := "\x80\x04" + c.want + "."; string(got) != want {
			t.Errorf("%d: % x, want % x", c.v, got, want)
		}
		v, err := unpickle(got)
		if err != nil || v.(*big.Int).Int64() != c.v {
			t.Errorf("%d decodes to %v (%v)", c.v, v, err)
		}
	}
	got := pickleOf(t, func(p *pickler) { p.uint(math.MaxUint64) })
	if want := "\x80\x04\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."; string(got) != want {
		t.Errorf("MaxUint64: % x", got)
	}
	if v, _ := unpickle(got); v.(*big.Int).String() != "18446744073709551615" {
		t.Errorf("MaxUint64 decodes to %v", v)
	}
}

// A nested value, with batches past pickleBatch, long strings and the memo.
func writeSample(p *pickler) {
	p.dict(func(key func(string)) {
		key("list")
		l := p.beginList()
		for i := 0; i < 2*pickleBatch+5; i++ {
			l.next()
			p.int(int64(i) * 1000003)
		}
		l.end()
		key("strs")
		l = p.beginList()
		for _, s := range []string{"", "héllo", strings.Repeat("x", 300), "héllo"} {
			l.next()
			p.mstr(s)
		}
		l.end()
		key("misc")
		p.tuple(4, func() { p.none(); p.boolean(true); p.boolean(false); p.float(-2.5) })
		key("pair")
		p.tuple(2, func() { p.int(0); p.uint(1 << 63) })
		key("empty")
		p.tuple(0, func() {})
	})
}

func TestPickleRoundTrip(t *testing.T) {
	b := pickleOf(t, writeSample)
	v, err := unpickle(b)
	if err != nil {
		t.Fatal(err)
	}
	d := plain(v).(map[string]any)
	l := d["list"].([]any)
	if len(l) != 2*pickleBatch+5 || l[2*pickleBatch+4].(*big.Int).Int64() != int64(2*pickleBatch+4)*1000003 {
		t.Errorf("list of %d", len(l))
	}
	s := d["strs"].([]any)
	if len(s) != 4 || s[1] != "héllo" || s[3] != "héllo" || s[2] != strings.Repeat("x", 300) || s[0] != "" {
		t.Errorf("strs %q", s)
	}
	if bytes.Count(b, []byte("héllo")) != 1 {
		t.Errorf("a memoized string written twice")
	}
	m := d["misc"].(pyTuple)
	if len(m) != 4 || m[0] != nil || m[1] != true || m[2] != false || m[3] != -2.5 {
		t.Errorf("misc %v", m)
	}
	if p := d["pair"].(pyTuple); len(p) != 2 || p[1].(*big.Int).String() != "9223372036854775808" {
		t.Errorf("pair %v", p)
	}
	if e := d["empty"].(pyTuple); len(e) != 0 {
		t.Errorf("empty %v", e)
	}
}

// Python's own unpickler reads it as the same value.
func TestPickleReadByPython(t *testing.T) {
	py := python(t)
	f := filepath.Join(t.TempDir(), "v.pickle")
	if err := os.WriteFile(f, pickleOf(t, writeSample), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert d["list"] == [i * 1000003 for i in range(2005)], d["list"][:5]
assert d["strs"] == ["", "h\u00e9llo", "x" * 300, "h\u00e9llo"] and d["strs"][1] is d["strs"][3]
assert d["misc"] == (None, True, False, -2.5) and d["pair"] == (0, 1 << 63) and d["empty"] == ()
print("ok")`
	out, err := exec.Command(py, "-c", script, f).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v: %s", err, out)
	}
}

// python is the project's virtual environment's interpreter, else python3;
// the test is skipped without one.
func python(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("PYTHON"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../.venv/bin/python"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python")
	}
	return p
}
