package trace

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseAttrInto(t *testing.T) {
	for _, tc := range []struct {
		kind Kind
		in   string
		want Event // Kind is filled in from kind
		out  string
	}{
		{KindSystem, "{}", Event{}, "{}"},
		{KindMalloc, "{allocation_id:2,addr:0x7F31c0000040,size:1048576,owner:PTA@model@weight,total:1048576,used:0}",
			Event{AllocID: 2, Ptr: 0x7f31c0000040, HasPtr: true, Size: 1048576, Owner: "PTA@model@weight",
				Extra: []KV{{"total", "1048576"}, {"used", "0"}}},
			"{allocation_id:2,addr:0x7f31c0000040,size:1048576,owner:PTA@model@weight,total:1048576,used:0}"},
		{KindMalloc, "{shadow:true,size:8,inefficient:early_allocation|late_deallocation,addr:0x0,allocation_id:18446744073709551615}",
			Event{AllocID: 1<<64 - 1, HasPtr: true, Size: 8, Inefficient: "early_allocation|late_deallocation", Shadow: true},
			"{allocation_id:18446744073709551615,addr:0x0,size:8,inefficient:early_allocation|late_deallocation,shadow:true}"},
		{KindFree, "{allocation_id:1,addr:0x10,size:4,owner:x}",
			Event{AllocID: 1, Ptr: 0x10, HasPtr: true, Size: 4, Extra: []KV{{"owner", "x"}}},
			"{allocation_id:1,addr:0x10,size:4,owner:x}"},
		{KindMstx, "{id:42}", Event{MstxID: 42}, "{id:42}"},
		{KindAccess, "{dtype:float,shape:[2x3],size:24,format:ND,type:READ,allocation_id:9}",
			Event{AllocID: 9, Size: 24, Extra: []KV{{"dtype", "float"}, {"shape", "[2x3]"}, {"size", "24"}, {"format", "ND"}, {"type", "READ"}, {"allocation_id", "9"}}},
			"{dtype:float,shape:[2x3],size:24,format:ND,type:READ,allocation_id:9}"},
		{KindSnapshot, "{rss:1,url:http://x:80/,empty:}",
			Event{Extra: []KV{{"rss", "1"}, {"url", "http://x:80/"}, {"empty", ""}}},
			"{rss:1,url:http://x:80/,empty:}"},
		{KindOpLaunch, "{id:1,size:x}", Event{Extra: []KV{{"id", "1"}, {"size", "x"}}}, "{id:1,size:x}"},
	} {
		e := Event{Kind: tc.kind}
		if err := ParseAttrInto(&e, tc.in); err != nil {
			t.Errorf("%v %q: %v", tc.kind, tc.in, err)
			continue
		}
		tc.want.Kind = tc.kind
		if !reflect.DeepEqual(e, tc.want) {
			t.Errorf("%v %q:\n got %+v\nwant %+v", tc.kind, tc.in, e, tc.want)
		}
		if got := e.Attr(); got != tc.out {
			t.Errorf("%v %q re-formats as %q, want %q", tc.kind, tc.in, got, tc.out)
		}
	}
}

func TestParseAttrErrors(t *testing.T) {
	for _, tc := range []struct {
		kind     Kind
		in, want string
	}{
		{KindSystem, "", "missing braces"},
		{KindSystem, "N/A", "missing braces"},
		{KindSystem, "{a:b", "missing braces"},
		{KindSystem, "a:b}", "missing braces"},
		{KindSystem, "}", "missing braces"},
		{KindSystem, "{a}", `pair "a" without ':'`},
		{KindSystem, "{a:b,}", `pair "" without ':'`},
		{KindSystem, "{,a:b}", `pair "" without ':'`},
		{KindSystem, "{:b}", `empty key in ":b"`},
		{KindSystem, "{a:{b}}", `unexpected '{' inside the braces`},
		{KindMalloc, "{allocation_id:1,addr:0x1,size:-1}", `bad size "-1"`},
		{KindMalloc, "{allocation_id:1,addr:0x1,size:18446744073709551616}", `bad size`},
		{KindMalloc, "{allocation_id:x,addr:0x1,size:1}", `bad allocation_id "x"`},
		{KindMalloc, "{allocation_id:1,addr:16,size:1}", `bad addr "16"`},
		{KindMalloc, "{allocation_id:1,addr:0x,size:1}", `bad addr "0x"`},
		{KindMalloc, "{allocation_id:1,addr:0x10000000000000000,size:1}", `bad addr`},
		{KindMalloc, "{allocation_id:1,addr:0x1,size:1,shadow:yes}", `bad shadow "yes"`},
		{KindMalloc, "{allocation_id:1,addr:0x1,size:1,size:2}", `duplicate key "size"`},
		{KindMalloc, "{addr:0x1,size:1}", "MALLOC without allocation_id"},
		{KindFree, "{allocation_id:1,size:1}", "FREE without addr"},
		{KindMstx, "{}", "MSTX without id"},
		{KindMstx, "{id:1,id:2}", `duplicate key "id"`},
		{KindAccess, "{allocation_id:z}", `bad allocation_id "z"`},
	} {
		e := Event{Kind: tc.kind}
		err := ParseAttrInto(&e, tc.in)
		if err == nil || !strings.HasPrefix(err.Error(), errAttrPrefix) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %q: error %v, want %q", tc.kind, tc.in, err, tc.want)
		}
	}
}

func TestParseAttrResets(t *testing.T) {
	e := Event{Kind: KindMalloc, AllocID: 5, Owner: "old", Shadow: true, Extra: []KV{{"a", "b"}}}
	if err := ParseAttrInto(&e, "{allocation_id:1,addr:0x2,size:3}"); err != nil {
		t.Fatal(err)
	}
	if e.Owner != "" || e.Shadow || e.Extra != nil || e.AllocID != 1 {
		t.Errorf("fields not reset: %+v", e)
	}
}

func FuzzParseAttr(f *testing.F) {
	for _, s := range []string{
		"{}", "{allocation_id:1,addr:0x10,size:4096,owner:HOST}", "{id:3}",
		"{allocation_id:2,addr:0x7f31c0000040,size:1048576,owner:PTA@model@weight,total:1048576,used:1048576}",
		"{allocation_id:1,addr:0x1,size:1,inefficient:a|b,shadow:true}", "{dtype:float,shape:[2x3],size:24,allocation_id:9}",
		"{a:b:c,d:}", "{:}", "{", "", "{a,b}", "{size:007,allocation_id:00,addr:0X00AB}", "{shadow:false,allocation_id:1,addr:0x1,size:1}",
	} {
		for k := KindSystem; k <= KindUnmap; k++ {
			f.Add(uint8(k), s)
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, s string) {
		e := Event{Kind: Kind(kind % 12)}
		if err := ParseAttrInto(&e, s); err != nil {
			if strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("error not one line: %q", err)
			}
			return
		}
		// The canonical form parses to the same fields and is a fixed point.
		out := e.Attr()
		e2 := Event{Kind: e.Kind}
		if err := ParseAttrInto(&e2, out); err != nil {
			t.Fatalf("%q re-formatted as %q, which does not parse: %v", s, out, err)
		}
		if e2.Attr() != out {
			t.Fatalf("%q: re-format not stable: %q then %q", s, out, e2.Attr())
		}
		if !reflect.DeepEqual(normExtra(e), normExtra(e2)) {
			t.Fatalf("%q -> %q: fields changed:\n%+v\n%+v", s, out, e, e2)
		}
	})
}

func normExtra(e Event) Event {
	if len(e.Extra) == 0 {
		e.Extra = nil
	}
	return e
}

// leanAttr, the fast path's Attr parser, agrees with parseAttr on every
// field it fills whenever it accepts a column; and it accepts the columns
// msmemscope writes.
func FuzzLeanAttr(f *testing.F) {
	for _, s := range []string{
		"{}", "{allocation_id:1,addr:0x10,size:4096,owner:HOST}", "{id:3}", "{id:3,id:4}",
		"{allocation_id:2,addr:0x7f31c0000040,size:1048576,owner:PTA@model@weight,total:1048576,used:1048576}",
		"{allocation_id:1,addr:0x1,size:1,inefficient:a|b,shadow:true}", "{dtype:float32,shape:[64x256],size:65536,format:N/A,type:PTA,allocation_id:168}",
		"{a:b:c,d:}", "{:}", "{", "", "{a,b}", "{size:007,allocation_id:00,addr:0X00AB}", "{size:4,}", "{size:4,,addr:0x1}",
		"{allocation_id:1,addr:0x00000000000000010,size:1}", "{allocation_id:99999999999999999999,addr:0x1,size:1}",
		"{size:8,allocation_id:3,size:9}", "{allocation_id:1,addr:0x1g,size:1}", "{addr:0x,allocation_id:1,size:1}",
		"{allocation_id:1,addr:0x1xsize:4}", "{alloc:1}", "{shape:[1],shadow:false,type:x,total:1,used:2,format:ND,inefficient:x,owner:y,dtype:z}",
	} {
		for k := KindSystem; k <= KindUnmap; k++ {
			f.Add(uint8(k), s)
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, s string) {
		k := Kind(kind % 12)
		want := Event{Kind: k}
		werr := parseAttr(&want, s, identity, identity)
		for _, lean := range []func(*Event) bool{
			func(e *Event) bool { return leanAttr(e, s, identity) },
			func(e *Event) bool { return leanAttr(e, []byte(s), func(b []byte) string { return string(b) }) },
		} {
			got := Event{Kind: k}
			if !lean(&got) {
				continue
			}
			if werr != nil {
				t.Fatalf("kind %v %q: leanAttr accepts what parseAttr refuses: %v", k, s, werr)
			}
			want.Extra = nil
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("kind %v %q: leanAttr %+v, parseAttr %+v", k, s, got, want)
			}
		}
	})
}

func TestLeanAttrAcceptsWrittenColumns(t *testing.T) {
	for _, e := range append(sampleEvents(), manyEvents(500)...) {
		attr := e.Attr()
		var got Event
		got.Kind = e.Kind
		if !leanAttr(&got, attr, identity) {
			t.Fatalf("%v %q: refused", e.Kind, attr)
		}
	}
}
