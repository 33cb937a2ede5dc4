package leakscan

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Mapping is one line of /proc/self/maps.
type Mapping struct {
	Lo, Hi uint64
	Perms  string // "rw-p"
	Path   string // "" for anonymous memory, "[stack]", a file
}

// ReadMaps parses a /proc/<pid>/maps text.
func ReadMaps(text []byte) []Mapping {
	var out []Mapping
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		l, err1 := strconv.ParseUint(lo, 16, 64)
		h, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		m := Mapping{Lo: l, Hi: h, Perms: f[1]}
		if len(f) >= 6 {
			m.Path = strings.Join(f[5:], " ")
		}
		out = append(out, m)
	}
	return out
}

// Process is the scanned process as the roots need it.
type Process struct {
	Maps []Mapping
	// Own are msmemscope's own ranges (its mappings, its library's file,
	// its Go heap): they hold every block's address and are never roots.
	Own []Region
	// StackSP is the main thread's stack pointer as the program left it
	// (0: unknown, the whole [stack] is read).
	StackSP uint64
	// ThreadSP are other threads' stack pointers: their stacks are read
	// from there up.
	ThreadSP []uint64
}

// Roots are the writable mappings less the heap (mappings that hold a live
// block) and msmemscope's own ranges; stacks from their stack pointer up.
// Device files are left out (reading them may have effects).
func (p *Process) Roots(blocks []Block) []Region {
	var out []Region
	starts := make([]uint64, len(blocks))
	for i := range blocks {
		starts[i] = blocks[i].Addr
	}
	holdsBlock := func(lo, hi uint64) bool {
		i := sort.Search(len(starts), func(i int) bool { return starts[i] >= lo })
		return i < len(starts) && starts[i] < hi
	}
	for _, m := range p.Maps {
		if len(m.Perms) < 2 || m.Perms[0] != 'r' || m.Perms[1] != 'w' {
			continue
		}
		if strings.HasPrefix(m.Path, "/dev/") && m.Path != "/dev/zero" || m.Path == "[vvar]" || m.Path == "[vsyscall]" {
			continue
		}
		if holdsBlock(m.Lo, m.Hi) {
			continue // the heap: its blocks are reached from the roots, not roots
		}
		lo := m.Lo
		if m.Path == "[stack]" && p.StackSP > m.Lo && p.StackSP < m.Hi {
			lo = p.StackSP
		}
		for _, sp := range p.ThreadSP {
			if sp > m.Lo && sp < m.Hi {
				lo = sp
			}
		}
		out = append(out, subtract(Region{lo, m.Hi}, p.Own)...)
	}
	return out
}

// subtract returns r less the ranges in own.
func subtract(r Region, own []Region) []Region {
	parts := []Region{r}
	for _, o := range own {
		var next []Region
		for _, q := range parts {
			if o.Hi <= q.Lo || o.Lo >= q.Hi {
				next = append(next, q)
				continue
			}
			if o.Lo > q.Lo {
				next = append(next, Region{q.Lo, o.Lo})
			}
			if o.Hi < q.Hi {
				next = append(next, Region{o.Hi, q.Hi})
			}
		}
		parts = next
	}
	return parts
}

// ThreadStackPointers returns the stack pointers of the process's threads
// other than skip (from /proc/self/task/*/syscall: known for a thread
// blocked in a system call).
func ThreadStackPointers(skip map[int]bool) []uint64 {
	dirs, _ := filepath.Glob("/proc/self/task/*")
	var out []uint64
	for _, d := range dirs {
		tid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || skip[tid] {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "syscall"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 9 { // "running", or "-1 sp pc" in user space
			if len(f) == 3 {
				if sp, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64); err == nil {
					out = append(out, sp)
				}
			}
			continue
		}
		if sp, err := strconv.ParseUint(strings.TrimPrefix(f[7], "0x"), 16, 64); err == nil {
			out = append(out, sp)
		}
	}
	return out
}

// SelfMemory reads this process's memory through /proc/self/mem: an address
// unmapped meanwhile is a short read, never a fault. Pages never touched
// (neither in memory nor swapped out, /proc/self/pagemap says) read as
// zeros without reading them: a large mapping used sparsely costs little.
type SelfMemory struct {
	f       *os.File
	pagemap *os.File  // nil: every page is read
	maps    []Mapping // by address
	pm      []byte
}

// OpenSelf opens this process's memory; maps are its mappings.
func OpenSelf(maps []Mapping) (*SelfMemory, error) {
	f, err := os.Open("/proc/self/mem")
	if err != nil {
		return nil, err
	}
	pm, _ := os.Open("/proc/self/pagemap")
	return &SelfMemory{f: f, pagemap: pm, maps: maps}, nil
}

// Close closes /proc/self/mem.
func (m *SelfMemory) Close() error {
	if m.pagemap != nil {
		m.pagemap.Close()
	}
	return m.f.Close()
}

const (
	pageSize  = 4096
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
)

// Read implements Memory.
func (m *SelfMemory) Read(addr uint64, buf []byte) int {
	if addr >= 1<<63 {
		return 0
	}
	if m.pagemap == nil || len(buf) < 4*pageSize {
		n, _ := m.f.ReadAt(buf, int64(addr))
		return n
	}
	first, last := addr/pageSize, (addr+uint64(len(buf))-1)/pageSize
	need := int(last-first+1) * 8
	if cap(m.pm) < need {
		m.pm = make([]byte, need)
	}
	pm := m.pm[:need]
	if n, _ := m.pagemap.ReadAt(pm, int64(first*8)); n < need {
		n, _ := m.f.ReadAt(buf, int64(addr))
		return n
	}
	// Read each run of touched pages; zero the others.
	for i := 0; i < len(pm)/8; {
		touched := binary.LittleEndian.Uint64(pm[8*i:])&(pmPresent|pmSwapped) != 0
		j := i + 1
		for j < len(pm)/8 && (binary.LittleEndian.Uint64(pm[8*j:])&(pmPresent|pmSwapped) != 0) == touched {
			j++
		}
		lo := max(addr, (first+uint64(i))*pageSize) - addr
		hi := min(addr+uint64(len(buf)), (first+uint64(j))*pageSize) - addr
		if touched {
			if n, _ := m.f.ReadAt(buf[lo:hi], int64(addr+lo)); n < int(hi-lo) {
				return int(lo) + n
			}
		} else {
			clear(buf[lo:hi])
		}
		i = j
	}
	return len(buf)
}

func (m *SelfMemory) mapping(addr uint64) *Mapping {
	i := sort.Search(len(m.maps), func(i int) bool { return m.maps[i].Hi > addr })
	if i < len(m.maps) && m.maps[i].Lo <= addr {
		return &m.maps[i]
	}
	return nil
}

// vtableWords is how many words of a vtable candidate are looked at
// (valgrind's VTABLE_MAX_CHECK).
const vtableWords = 20

// IsVtable implements Memory, as valgrind's
// aligned_ptr_above_page0_is_vtable_addr.
func (m *SelfMemory) IsVtable(addr uint64) bool {
	seg := m.mapping(addr)
	if seg == nil || seg.Path == "" || strings.HasPrefix(seg.Path, "[") || seg.Perms[0] != 'r' {
		return false
	}
	end := min(addr+vtableWords*8, seg.Hi)
	var buf [vtableWords * 8]byte
	n := m.Read(addr, buf[:end-addr])
	fns := 0
	for off := 0; off+8 <= n; off += 8 {
		fn := binary.LittleEndian.Uint64(buf[off:])
		if fn == 0 {
			continue
		}
		t := m.mapping(fn)
		if t == nil || t.Path == "" || strings.HasPrefix(t.Path, "[") || len(t.Perms) < 3 || t.Perms[2] != 'x' {
			return false
		}
		if fns++; fns == 2 {
			return true
		}
	}
	return false
}

// FillUsable sets each block's Usable from glibc's chunk header, the word
// before the block: the chunk's size with its flag bits (an mmapped chunk's
// usable size is two words less, the others' one).
func FillUsable(blocks []Block, mem Memory) {
	var buf []byte
	var base uint64
	for i := range blocks {
		h := blocks[i].Addr - 8
		if buf == nil || h < base || h+8 > base+uint64(len(buf)) {
			base = h
			end := h + 64<<10
			// Read up to the last header within reach, not past it.
			j := i
			for j+1 < len(blocks) && blocks[j+1].Addr < end {
				j++
			}
			buf = make([]byte, blocks[j].Addr-h)
			buf = buf[:mem.Read(base, buf)]
		}
		if h+8 > base+uint64(len(buf)) {
			buf = nil
			continue
		}
		w := binary.LittleEndian.Uint64(buf[h-base:])
		size := w &^ 7
		over := uint64(8)
		if w&2 != 0 {
			over = 16
		}
		if size > over && size-over >= blocks[i].Size {
			blocks[i].Usable = size - over
		}
	}
}
