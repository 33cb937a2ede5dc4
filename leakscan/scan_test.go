package leakscan

import (
	"encoding/binary"
	"reflect"
	"testing"
)

// fakeMem is memory made of segments (start -> bytes).
type fakeMem map[uint64][]byte

func (m fakeMem) Read(addr uint64, buf []byte) int {
	for lo, b := range m {
		if addr >= lo && addr < lo+uint64(len(b)) {
			return copy(buf, b[addr-lo:])
		}
	}
	return 0
}

func (m fakeMem) IsVtable(addr uint64) bool { return false }

// words writes the given words at addr (a segment of its own).
func (m fakeMem) words(addr uint64, size int, ws ...uint64) {
	b := make([]byte, size)
	for i, w := range ws {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	m[addr] = b
}

func TestClassify(t *testing.T) {
	mem := fakeMem{}
	blocks := []Block{
		{Addr: 0x1000, Size: 32},             // A: from a root, at its start
		{Addr: 0x2000, Size: 32},             // B: from A
		{Addr: 0x3000, Size: 32},             // C: from a root, inside it only
		{Addr: 0x4000, Size: 32},             // D: from C (possible, so possibly)
		{Addr: 0x5000, Size: 32},             // E: a cycle with F, nothing else
		{Addr: 0x6000, Size: 32},             // F
		{Addr: 0x7000, Size: 20, Usable: 24}, // G: glibc's top points at its end
		{Addr: 0x8000, Size: 40},             // H: length64 (a length, then data)
		{Addr: 0x9000, Size: 16},             // I: from a register
	}
	mem.words(0x100, 48, 0x1000, 0x3008, 0x7000+24-8, 0x8008, 0xdead)
	mem.words(0x1000, 32, 0x2000)
	mem.words(0x2000, 32)
	mem.words(0x3000, 32, 0, 0x4000)
	mem.words(0x4000, 32)
	mem.words(0x5000, 32, 0x6000)
	mem.words(0x6000, 32, 0x5010)
	mem.words(0x7000, 24)
	mem.words(0x8000, 40, 32)
	mem.words(0x9000, 16)
	got := Classify(blocks, []Region{{0x100, 0x130}}, []uint64{0x9000}, mem)
	want := []Kind{StillReachable, StillReachable, PossiblyLost, PossiblyLost, DefinitelyLost, IndirectlyLost, DefinitelyLost, StillReachable, StillReachable}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("kinds\n got %v\nwant %v", got, want)
	}
}

// A lost cycle's leader is the block allocated first, as valgrind's
// (its addresses follow allocation order), though glibc put it higher.
func TestCliqueLeaderByAllocation(t *testing.T) {
	mem := fakeMem{}
	blocks := []Block{
		{Addr: 0x1000, Size: 72, N: 2}, // b: reuses a freed block's chunk, below a
		{Addr: 0x2000, Size: 48, N: 1}, // a: allocated first
	}
	mem.words(0x1000, 72, 0x2000)
	mem.words(0x2000, 48, 0x1000)
	got := Classify(blocks, nil, nil, mem)
	if want := []Kind{IndirectlyLost, DefinitelyLost}; !reflect.DeepEqual(got, want) {
		t.Errorf("kinds %v, want %v", got, want)
	}
}

func TestAddrLife(t *testing.T) {
	for _, c := range []struct {
		l    addrLife
		live bool
	}{
		{addrLife{mallocs: 1}, true},
		{addrLife{mallocs: 1, frees: 1}, false},
		{addrLife{mallocs: 0, frees: 1}, false},
		{addrLife{mallocs: 3, frees: 2}, true},
	} {
		if got := c.l.live(); got != c.live {
			t.Errorf("%+v: live %v, want %v", c.l, got, c.live)
		}
	}
}

func TestRoots(t *testing.T) {
	maps := ReadMaps([]byte(`00400000-00401000 r-xp 00000000 08:01 1 /bin/prog
00600000-00602000 rw-p 00000000 08:01 1 /bin/prog
01000000-01100000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000010000 rw-p 00000000 00:00 0
7f0000020000-7f0000030000 rw-p 00000000 00:00 0
7f0000040000-7f0000041000 rw-s 00000000 00:05 9 /dev/null
7f0000050000-7f0000051000 rw-s 00000000 00:01 7 /dev/zero (deleted)
7f0004000000-7f0004100000 rw-p 00000000 00:00 0
7ffe00000000-7ffe00100000 rw-p 00000000 00:00 0 [stack]
`))
	mem := fakeMem{}
	mem.words(0x7f0004000000, 32, 0x7f0004000020, 0, 0x100000) // an arena's first heap: its heap_info
	p := &Process{Maps: maps, Own: []Region{{0x7f0000020000, 0x7f0000028000}}, StackSP: 0x7ffe000ff000}
	blocks := []Block{{Addr: 0x1000010, Size: 16, Usable: 24}, {Addr: 0x7f0000001010, Size: 32, Usable: 40}}
	got := p.Roots(blocks, mem)
	want := []Region{{0x600000, 0x602000}, {0x7f0000000000, 0x7f0000001000}, {0x7f0000001038, 0x7f0000010000},
		{0x7f0000028000, 0x7f0000030000}, {0x7f0000050000, 0x7f0000051000}, {0x7ffe000ff000, 0x7ffe00100000}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("roots\n got %x\nwant %x", got, want)
	}
}

func TestMaskHas(t *testing.T) {
	status := []byte("Name:\tprog\nSigPnd:\t0000000000000000\nSigBlk:\t0800000000000001\nSigIgn:\t0000000000001000\n")
	for _, c := range []struct {
		sig  int
		want bool
	}{{1, true}, {2, false}, {60, true}, {61, false}, {64, false}, {0, true}} {
		if got := maskHas(status, "SigBlk:", c.sig); got != c.want {
			t.Errorf("SigBlk has %d: %v, want %v", c.sig, got, c.want)
		}
	}
	if !maskHas([]byte("Name:\tprog\n"), "SigBlk:", 2) {
		t.Error("a status with no SigBlk line: want blocked (cannot be told)")
	}
}
