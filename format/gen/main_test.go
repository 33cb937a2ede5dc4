package main

import "testing"

// The committed files are what records.def gives (make generate writes them).
func TestGeneratedFilesCurrent(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if err := run(root, true); err != nil {
		t.Fatal(err)
	}
}

func TestEval(t *testing.T) {
	vals := map[string]uint64{"A": 1 << 63, "B": 4}
	for _, c := range []struct {
		expr string
		want uint64
	}{
		{"17", 17}, {"0x1fff", 0x1fff}, {"1<<63", 1 << 63}, {"(1<<48)-1", 1<<48 - 1},
		{"A|B", 1<<63 | 4}, {"1 << B", 16}, {"1<<2+1", 8},
	} {
		got, err := eval(c.expr, vals)
		if err != nil || got != c.want {
			t.Errorf("eval(%q) = %#x, %v; want %#x", c.expr, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "C", "1<<", "(1", "1)"} {
		if _, err := eval(bad, vals); err == nil {
			t.Errorf("eval(%q): no error", bad)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, src := range []string{
		"R_X RX 1\n",                 // before any section
		"[kind]\nR_X RX 0x8000\n",    // kind too large
		"[flag]\nF_X FX 0x10000\n",   // flag too large
		"[const]\nA GA 1\nA GB 2\n",  // twice
		"[struct ms_x X]\nf u24 F\n", // unknown type
		"[nothing]\n",                // unknown section
		"[const]\nA GA\n",            // a column missing
	} {
		if _, err := Parse([]byte(src)); err == nil {
			t.Errorf("Parse(%q): no error", src)
		}
	}
	tb, err := Parse([]byte("[struct ms_x X]\na u8 A\nb u64 B\nc u16 C\n"))
	if err != nil || tb.Structs[0].Fields[1].Off != 8 || tb.Structs[0].Size != 24 {
		t.Fatalf("struct layout: %+v %v", tb, err)
	}
}
