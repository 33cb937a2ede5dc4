// Package leakscan sorts the blocks alive at exit into valgrind's leak kinds
// by scanning memory for pointers to them, as memcheck does (its
// mc_leakcheck.c): blocks pointed to from the roots are reachable, and so is
// what they point to; blocks reached only through interior pointers are
// possibly lost; what is left is lost, definitely for the blocks nothing
// points to, indirectly for those reached only from lost blocks.
//
// The scan runs inside the traced process after every destructor
// (libmemscope/exitscan.c); the roots are its writable mappings less the
// heap and msmemscope's own memory (proc.go); the live blocks come from the
// capture (live.go).
package leakscan

import (
	"encoding/binary"
	"sort"
)

// Kind is a live block's leak kind.
type Kind uint8

// The kinds, in valgrind's order of its leak summary.
const (
	Unknown Kind = iota
	DefinitelyLost
	IndirectlyLost
	PossiblyLost
	StillReachable
)

// String is the kind's name in the leaks CSV.
func (k Kind) String() string {
	switch k {
	case DefinitelyLost:
		return "definitely_lost"
	case IndirectlyLost:
		return "indirectly_lost"
	case PossiblyLost:
		return "possibly_lost"
	case StillReachable:
		return "still_reachable"
	}
	return "N/A"
}

// Block is a live heap block.
type Block struct {
	Addr, Size uint64 // start and requested size
	// Usable is the allocator's usable size (0: unknown). The word at
	// Addr+Usable-8 is glibc's next chunk's header: its bins and top
	// point there, so such a pointer does not reach this block.
	Usable uint64
	// N is its MALLOC's place in the records read (0: unknown): a thread's
	// come in the order it allocated. Lost blocks lead their cliques in
	// this order (Classify).
	N uint64
}

// Memory reads the scanned process's memory.
type Memory interface {
	// Read fills buf from addr; it returns how many bytes it could read.
	Read(addr uint64, buf []byte) int
	// IsVtable reports whether addr looks like a C++ vtable (the
	// multipleinheritance heuristic): in a readable file mapping, with at
	// least two pointers to executable file mappings among its first words
	// and nothing else but nulls.
	IsVtable(addr uint64) bool
}

// Region is an address range [Lo, Hi) to scan as a root.
type Region struct{ Lo, Hi uint64 }

// scan states (memcheck's Reachedness, and its IndirectLeak).
const (
	unreached uint8 = iota
	possible
	reachable
	indirect
)

type scanner struct {
	b     []Block // by address
	st    []uint8
	mem   Memory
	marks []int32
	lo    uint64 // the lowest block's start and the highest block's end
	hi    uint64
	buf   []byte
	// clique: scanning from an unreached block (-1: from roots or the
	// reachable and possible blocks)
	clique int
}

// Classify returns the kind of each block (sorted by Addr, not overlapping)
// after scanning the roots: memory ranges, and words (registers).
func Classify(blocks []Block, roots []Region, regs []uint64, mem Memory) []Kind {
	s := &scanner{b: blocks, st: make([]uint8, len(blocks)), mem: mem, clique: -1}
	if len(blocks) > 0 {
		s.lo = blocks[0].Addr
		for i := range blocks {
			s.hi = max(s.hi, blocks[i].Addr+max(blocks[i].Size, 1))
		}
	}
	for _, p := range regs {
		if p >= s.lo && p < s.hi {
			s.push(p, true)
		}
	}
	s.drain()
	for _, r := range roots {
		s.scanRange(r.Lo, r.Hi, true)
		s.drain()
	}
	// What is still unreached is lost: each in turn leads a clique of the
	// unreached blocks it reaches, which are indirectly lost. In the order
	// they were allocated: valgrind takes them by address, and its
	// allocator hands out addresses in allocation order (it reuses freed
	// memory late), where glibc's reuse would make a cycle's later block
	// the leader.
	lost := make([]int, 0)
	for i := range blocks {
		if s.st[i] == unreached {
			lost = append(lost, i)
		}
	}
	sort.SliceStable(lost, func(a, b int) bool { return blocks[lost[a]].N < blocks[lost[b]].N })
	for _, i := range lost {
		if s.st[i] != unreached {
			continue
		}
		s.clique = i
		s.marks = append(s.marks, int32(i))
		s.drain()
	}
	kinds := make([]Kind, len(blocks))
	for i, st := range s.st {
		switch st {
		case unreached:
			kinds[i] = DefinitelyLost
		case indirect:
			kinds[i] = IndirectlyLost
		case possible:
			kinds[i] = PossiblyLost
		default:
			kinds[i] = StillReachable
		}
	}
	return kinds
}

// drain scans the blocks on the mark stack.
func (s *scanner) drain() {
	for len(s.marks) > 0 {
		i := s.marks[len(s.marks)-1]
		s.marks = s.marks[:len(s.marks)-1]
		b := &s.b[i]
		s.scanRange(b.Addr, b.Addr+b.Size, s.st[i] == reachable)
	}
}

const window = 1 << 20

// scanRange looks at every aligned word of [lo, hi) for a pointer to a block.
func (s *scanner) scanRange(lo, hi uint64, definite bool) {
	lo = (lo + 7) &^ 7
	for lo+8 <= hi {
		n := min(hi-lo, window) &^ 7
		if cap(s.buf) < int(n) {
			s.buf = make([]byte, window)
		}
		buf := s.buf[:n]
		got := s.mem.Read(lo, buf)
		for off := 0; off+8 <= got; off += 8 {
			if p := binary.LittleEndian.Uint64(buf[off:]); p >= s.lo && p < s.hi {
				s.push(p, definite)
			}
		}
		if got < int(n) {
			// Unreadable from here: skip to the next page.
			lo = (lo + uint64(got) + 4096) &^ 4095
			continue
		}
		lo += n
	}
}

// find returns the block p points into (start: at its start), or -1.
func (s *scanner) find(p uint64) (int, bool) {
	i := sort.Search(len(s.b), func(i int) bool { return s.b[i].Addr > p }) - 1
	if i < 0 {
		return -1, false
	}
	b := &s.b[i]
	if p == b.Addr {
		return i, true
	}
	if p >= b.Addr+b.Size || b.Usable >= 16 && p == b.Addr+b.Usable-8 {
		return -1, false
	}
	return i, false
}

// push notes a pointer p found in a root (definite) or a block.
func (s *scanner) push(p uint64, definite bool) {
	i, start := s.find(p)
	if i < 0 {
		return
	}
	if s.clique >= 0 {
		// From a lost block: anything unreached it points to, at its
		// start or inside, is lost through it.
		if s.st[i] == unreached && i != s.clique {
			s.st[i] = indirect
			s.marks = append(s.marks, int32(i))
		}
		return
	}
	if s.st[i] == reachable {
		return
	}
	via := possible
	if start || s.heuristic(p, i) {
		via = reachable
	}
	switch {
	case via == reachable && definite:
		s.st[i] = reachable
		s.marks = append(s.marks, int32(i))
	case s.st[i] == unreached:
		s.st[i] = possible
		s.marks = append(s.marks, int32(i))
	}
}

// heuristic reports whether interior pointer p reaches block i by one of
// valgrind's default heuristics (--leak-check-heuristics=all): stdstring,
// length64, newarray, multipleinheritance.
func (s *scanner) heuristic(p uint64, i int) bool {
	b := &s.b[i]
	var w [4]uint64
	var raw [32]byte
	n := s.mem.Read(b.Addr, raw[:min(uint64(len(raw)), b.Size)&^7])
	for k := 0; k+8 <= n; k += 8 {
		w[k/8] = binary.LittleEndian.Uint64(raw[k:])
	}
	words := uint64(n / 8)
	// stdstring: length, capacity, refcount, then the characters.
	if p == b.Addr+24 && words >= 2 {
		if capacity := w[1]; 24+capacity+1 == b.Size && w[0] <= capacity {
			return true
		}
	}
	if p == b.Addr+8 && words >= 1 {
		// length64: the length of what follows; newarray: an element
		// count that divides the rest.
		if w[0] > 0 && b.Size-8 == w[0] {
			return true
		}
		if w[0] > 0 && (b.Size-8)%w[0] == 0 {
			return true
		}
	}
	// multipleinheritance: p points at a vtable pointer inside an object
	// that starts with one.
	if p&7 == 0 && words >= 1 {
		var in [8]byte
		if s.mem.Read(p, in[:]) == 8 {
			inner, first := binary.LittleEndian.Uint64(in[:]), w[0]
			if inner&7 == 0 && inner >= 4096 && first&7 == 0 && first >= 4096 &&
				s.mem.IsVtable(inner) && s.mem.IsVtable(first) {
				return true
			}
		}
	}
	return false
}
