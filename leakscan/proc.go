package leakscan

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"msmemscope/symbolize"
)

// Mapping is one line of /proc/self/maps.
type Mapping = symbolize.MapsLine

// ReadMaps parses a /proc/<pid>/maps text.
func ReadMaps(text []byte) []Mapping {
	var out []Mapping
	for _, line := range strings.Split(string(text), "\n") {
		if m, ok := symbolize.ParseMapsLine(line); ok {
			out = append(out, m)
		}
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
	// ThreadSP are other threads' stack pointers (a stopped thread's less
	// its red zone): their stacks are read from there up.
	ThreadSP []uint64
	// Dead are the stacks of threads that ended (glibc may keep them for
	// new threads): not roots, unless a live thread's stack pointer is in
	// one (it was given to that thread).
	Dead []Region
}

// Roots are the writable mappings less the heap and msmemscope's own
// ranges; stacks from their stack pointer up. The heap is glibc's: the brk
// heap ([heap]) and its other arenas' heaps are left out whole (their free
// chunks hold stale pointers); elsewhere only each live block's chunk is
// (an mmapped chunk is a mapping of its own, but the kernel may merge it
// with a neighbouring anonymous mapping). Character devices are not read
// (a GPU's mappings); shared anonymous memory (/dev/zero) and /dev/shm
// files are. blocks must have Usable set (FillUsable).
func (p *Process) Roots(blocks []Block, mem Memory) []Region {
	var out []Region
	sps := append([]uint64{p.StackSP}, p.ThreadSP...)
	skip := append([]Region(nil), p.Own...)
	for _, d := range p.Dead {
		if !slices.ContainsFunc(sps, func(sp uint64) bool { return sp >= d.Lo && sp < d.Hi }) {
			skip = append(skip, d)
		}
	}
	for _, m := range p.Maps {
		if len(m.Perms) < 2 || m.Perms[0] != 'r' || m.Perms[1] != 'w' {
			continue
		}
		if m.Path == "[heap]" || m.Path == "[vvar]" || m.Path == "[vsyscall]" || charDevice(m.Path) || arenaHeap(m, mem) {
			continue
		}
		lo := m.Lo
		for _, sp := range sps {
			if sp > m.Lo && sp < m.Hi {
				lo = sp // a stack: its live part
			}
		}
		for _, r := range subtract(Region{lo, m.Hi}, skip) {
			out = append(out, chunksOut(r, blocks)...)
		}
	}
	return out
}

// charDevice reports whether path names a character device.
func charDevice(path string) bool {
	if !strings.HasPrefix(path, "/dev/") || path == "/dev/zero" {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// glibc's non-main arenas live in heaps aligned to their maximum size (64
// MiB), each starting with a heap_info whose first word points at its
// arena (in the arena's first heap, just past that heap_info).
const arenaHeapAlign = 64 << 20

func arenaHeap(m Mapping, mem Memory) bool {
	if m.Path != "" || m.Lo%arenaHeapAlign != 0 {
		return false
	}
	var b [24]byte
	if mem.Read(m.Lo, b[:]) != len(b) {
		return false
	}
	ar, size := binary.LittleEndian.Uint64(b[:]), binary.LittleEndian.Uint64(b[16:])
	off := ar % arenaHeapAlign
	return ar != 0 && off >= 16 && off < 256 && size > 0 && size <= arenaHeapAlign
}

// chunksOut returns r less the chunks of the blocks in it: from its
// header (two words before the block) to its usable end.
func chunksOut(r Region, blocks []Block) []Region {
	i := sort.Search(len(blocks), func(i int) bool { return chunkEnd(&blocks[i]) > r.Lo })
	var out []Region
	lo := r.Lo
	for ; i < len(blocks) && blocks[i].Addr-16 < r.Hi; i++ {
		if s := blocks[i].Addr - 16; s > lo {
			out = append(out, Region{lo, s})
		}
		lo = max(lo, chunkEnd(&blocks[i]))
	}
	if lo < r.Hi {
		out = append(out, Region{lo, r.Hi})
	}
	return out
}

func chunkEnd(b *Block) uint64 {
	if b.Usable > 0 {
		return b.Addr + b.Usable
	}
	return b.Addr + (b.Size+7)&^7
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

// Tasks returns the ids of this process's threads (/proc/self/task).
func Tasks() []int {
	dirs, _ := filepath.Glob("/proc/self/task/*")
	var out []int
	for _, d := range dirs {
		if tid, err := strconv.Atoi(filepath.Base(d)); err == nil {
			out = append(out, tid)
		}
	}
	return out
}

// SignalBlocked reports whether thread tid blocks signal sig (SigBlk in its
// status), or cannot be told.
func SignalBlocked(tid, sig int) bool {
	b, err := os.ReadFile(filepath.Join("/proc/self/task", strconv.Itoa(tid), "status"))
	if err != nil {
		return true
	}
	return maskHas(b, "SigBlk:", sig)
}

// maskHas reports whether the signal mask on status's line key holds sig
// (true when the line is missing).
func maskHas(status []byte, key string, sig int) bool {
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err != nil || sig < 1 || sig > 64 || m&(1<<(sig-1)) != 0
		}
	}
	return true
}

// ThreadStackPointers returns the stack pointers of the process's threads
// other than skip (from /proc/self/task/*/syscall: known for a thread
// blocked in a system call).
func ThreadStackPointers(skip map[int]bool) []uint64 {
	var out []uint64
	for _, tid := range Tasks() {
		if skip[tid] {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc/self/task", strconv.Itoa(tid), "syscall"))
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
