package export

import (
	"sort"
	"strconv"
	"strings"

	"msmemscope/trace"
)

// memory_viz: the capture as the snapshot pickle that PyTorch's memory
// viewer (pytorch.org/memory_viz) opens and torch.cuda._memory_viz's trace,
// segments and segsum read, in torch.cuda.memory._snapshot()'s layout:
// "segments" (the state at the end) and "device_traces" (one list of
// actions per device, in time order).
//
// PTA rows are the blocks (tensors' memory). HAL rows of device and
// managed memory are the segments (memory obtained from the driver): a PTA
// block whose range lies inside a live HAL segment of its device belongs to
// it. Every other block (CPU tensors, which have no segments, and CUDA
// blocks outside any known segment, as in VMM's expandable segments, whose
// HAL rows carry a handle and no address) is its own segment, of its size:
// a segment_alloc before its alloc, a segment_free after its free. CUDA
// ordinal N is device N; "host" is the device after the highest CUDA
// ordinal of the capture (device 0 when no CUDA device appears).
//
// The trace keeps the newest memvizMaxEntries actions (as PyTorch's
// max_entries does) and stays balanced: a block or segment alive when the
// kept trace begins (allocated before the capture, or before the entries
// kept) gets an alloc at its start, so every free follows an alloc at its
// address. Memory: the live blocks and segments, the kept entries, and each
// distinct stack once while something refers to it.
type memvizWriter struct {
	max    int
	ring   []vizEntry
	head   int    // the oldest entry, once the ring is full
	pushed uint64 // entries ever pushed: an entry's seq is its place in that count

	stacks  stackTab
	blocks  map[uint64]*vizBlock // by allocation id
	blockAt map[addrKey]*vizBlock
	segs    map[uint64]*vizSeg  // by allocation id
	segList map[int16][]*vizSeg // each device's live segments, by address
	devFree map[int16]uint64    // a device's free bytes at its last SNAPSHOT
	maxDev  int16               // the highest CUDA ordinal seen, -1: none
	host    bool                // a host block was seen
}

// memvizMaxEntries bounds the trace (all devices together), keeping the newest.
var memvizMaxEntries = 1_000_000

type vizAct uint8

const (
	vizAlloc    vizAct = iota + 1 // alloc (own segment: segment_alloc first)
	vizFree                       // free_requested, free_completed (own segment: segment_free after)
	vizSegAlloc                   // segment_alloc
	vizSegFree                    // segment_free
	vizOOM                        // oom: size requested, addr the device's free bytes
)

const vizHost int16 = -1 // the Device of host blocks

type vizEntry struct {
	ns, addr, size, stream uint64
	stack                  int32
	dev                    int16
	act                    vizAct
	own                    bool // a block that is its own segment
}

type vizBlock struct {
	addr, size, stream, seq uint64
	id                      uint64
	stack                   int32
	dev                     int16
	seg                     *vizSeg // the HAL segment holding it; nil: its own
}

type vizSeg struct {
	addr, size, stream, seq uint64
	id                      uint64
	stack                   int32
	dev                     int16
	blocks                  int // live blocks inside
}

type addrKey struct {
	dev  int16
	addr uint64
}

func newMemviz() *memvizWriter {
	return &memvizWriter{max: max(1, memvizMaxEntries), stacks: stackTab{ids: map[string]int32{}},
		blocks: map[uint64]*vizBlock{}, blockAt: map[addrKey]*vizBlock{}, segs: map[uint64]*vizSeg{},
		segList: map[int16][]*vizSeg{}, devFree: map[int16]uint64{}, maxDev: -1}
}

func (m *memvizWriter) Name() (string, string) { return "memory_viz_", ".pickle" }

// Note says that the snapshot is empty (PyTorch's viewer shows tensors and
// device memory: the host heap has no place there).
func (m *memvizWriter) Note() string {
	if m.pushed > 0 {
		return ""
	}
	return "--export=memory_viz: the capture has no tensor (PTA) or device (HAL) block, so its snapshot is empty"
}

// stackTab holds each distinct stack once, with a count of its holders.
type stackTab struct {
	ids  map[string]int32
	strs []string
	refs []int32
	free []int32
}

// intern returns s's id, held once for the caller; "" is -1 (no frames).
func (t *stackTab) intern(s string) int32 {
	if s == "" {
		return -1
	}
	if id, ok := t.ids[s]; ok {
		t.refs[id]++
		return id
	}
	var id int32
	if n := len(t.free); n > 0 {
		id = t.free[n-1]
		t.free = t.free[:n-1]
	} else {
		id = int32(len(t.strs))
		t.strs = append(t.strs, "")
		t.refs = append(t.refs, 0)
	}
	s = strings.Clone(s)
	t.ids[s], t.strs[id], t.refs[id] = id, s, 1
	return id
}

func (t *stackTab) hold(id int32) {
	if id >= 0 {
		t.refs[id]++
	}
}

func (t *stackTab) drop(id int32) {
	if id < 0 {
		return
	}
	if t.refs[id]--; t.refs[id] == 0 {
		delete(t.ids, t.strs[id])
		t.strs[id] = ""
		t.free = append(t.free, id)
	}
}

func (m *memvizWriter) push(x vizEntry) uint64 {
	m.stacks.hold(x.stack)
	if len(m.ring) < m.max {
		m.ring = append(m.ring, x)
	} else {
		m.stacks.drop(m.ring[m.head].stack)
		m.ring[m.head] = x
		m.head = (m.head + 1) % m.max
	}
	m.pushed++
	return m.pushed - 1
}

// entry is the i-th oldest kept entry.
func (m *memvizWriter) entry(i int) *vizEntry { return &m.ring[(m.head+i)%len(m.ring)] }

// device maps a Device Id to a CUDA ordinal or vizHost.
func (m *memvizWriter) device(d string) (int16, bool) {
	if d == trace.DeviceHost {
		return vizHost, true
	}
	n, err := strconv.ParseUint(d, 10, 15)
	if err != nil {
		return 0, false
	}
	return int16(n), true
}

func (m *memvizWriter) note(dev int16) {
	if dev == vizHost {
		m.host = true
	} else {
		m.maxDev = max(m.maxDev, dev)
	}
}

func streamOf(e *trace.Event) uint64 {
	s, ok := e.Get("stream")
	if !ok {
		return 0
	}
	var v uint64
	var err error
	if h, hex := strings.CutPrefix(s, "0x"); hex {
		v, err = strconv.ParseUint(h, 16, 64)
	} else {
		v, err = strconv.ParseUint(s, 10, 64)
	}
	if err != nil {
		return 0
	}
	return v
}

func (m *memvizWriter) Observe(e *trace.Event) {
	switch e.Kind {
	case trace.KindMalloc, trace.KindFree:
		if e.Type != trace.TypePTA && e.Type != trace.TypeHAL {
			return
		}
		dev, ok := m.device(e.Device)
		if !ok || (e.Type == trace.TypeHAL && dev == vizHost) {
			return
		}
		if k, _ := e.Get("kind"); e.Type == trace.TypeHAL && k == "vmm" {
			return // a physical handle, not an address range
		}
		m.note(dev)
		switch {
		case e.Type == trace.TypePTA && e.Kind == trace.KindMalloc:
			m.allocBlock(e, dev)
		case e.Type == trace.TypePTA:
			m.freeBlockEvent(e, dev)
		case e.Kind == trace.KindMalloc:
			m.allocSeg(e, dev)
		default:
			m.freeSegEvent(e, dev)
		}
	case trace.KindOOM:
		if dev, ok := m.device(e.Device); ok && e.Type == trace.TypeHAL && dev != vizHost {
			m.note(dev)
			size := e.Size
			if s, ok := e.Get("size"); ok && size == 0 {
				size, _ = strconv.ParseUint(s, 10, 64)
			}
			st := m.stacks.intern(eventStack(e))
			m.push(vizEntry{act: vizOOM, ns: e.Timestamp, size: size, addr: m.devFree[dev], stack: st, dev: dev})
			m.stacks.drop(st)
		}
	case trace.KindSnapshot:
		if dev, ok := m.device(e.Device); ok && dev != vizHost {
			if f, ok := e.Get("free"); ok {
				if v, err := strconv.ParseUint(f, 10, 64); err == nil {
					m.devFree[dev] = v
				}
			}
		}
	}
}

// segAt is the live segment of dev that holds [addr, addr+size).
func (m *memvizWriter) segAt(dev int16, addr, size uint64) *vizSeg {
	l := m.segList[dev]
	i := sort.Search(len(l), func(i int) bool { return l[i].addr > addr }) - 1
	if i >= 0 && addr+size <= l[i].addr+l[i].size {
		return l[i]
	}
	return nil
}

func (m *memvizWriter) allocBlock(e *trace.Event, dev int16) {
	if e.Ptr == 0 {
		return
	}
	if old := m.blocks[e.AllocID]; old != nil { // a MALLOC seen again replaces its block
		m.freeBlock(old, e.Timestamp, -1)
	}
	if old := m.blockAt[addrKey{dev, e.Ptr}]; old != nil { // its free was never seen
		m.freeBlock(old, e.Timestamp, -1)
	}
	b := &vizBlock{addr: e.Ptr, size: e.Size, id: e.AllocID, dev: dev, stream: streamOf(e),
		stack: m.stacks.intern(eventStack(e))}
	if dev != vizHost {
		if b.seg = m.segAt(dev, b.addr, b.size); b.seg != nil {
			b.seg.blocks++
			b.stream = b.seg.stream
		}
	}
	m.blocks[b.id] = b
	m.blockAt[addrKey{dev, b.addr}] = b
	b.seq = m.push(vizEntry{act: vizAlloc, ns: e.Timestamp, addr: b.addr, size: b.size, stream: b.stream,
		stack: b.stack, dev: dev, own: b.seg == nil})
}

// freeBlock ends a live block; stack is the free's own stack (-1: none,
// the block's is used).
func (m *memvizWriter) freeBlock(b *vizBlock, ns uint64, stack int32) {
	if stack < 0 {
		stack = b.stack
	}
	m.push(vizEntry{act: vizFree, ns: ns, addr: b.addr, size: b.size, stream: b.stream, stack: stack,
		dev: b.dev, own: b.seg == nil})
	if m.blocks[b.id] == b {
		delete(m.blocks, b.id)
	}
	delete(m.blockAt, addrKey{b.dev, b.addr})
	if b.seg != nil {
		b.seg.blocks--
	}
	m.stacks.drop(b.stack)
}

func (m *memvizWriter) freeBlockEvent(e *trace.Event, dev int16) {
	st := m.stacks.intern(eventStack(e))
	defer m.stacks.drop(st)
	b := m.blocks[e.AllocID]
	if b == nil && e.Ptr != 0 {
		b = m.blockAt[addrKey{dev, e.Ptr}]
	}
	if b != nil {
		m.freeBlock(b, e.Timestamp, st)
		return
	}
	if e.Ptr == 0 || e.Size == 0 {
		return // allocated before the capture, and nothing to show of it
	}
	// Allocated before the capture: Encode gives it an alloc at the start.
	seg := (*vizSeg)(nil)
	stream := streamOf(e)
	if dev != vizHost {
		if seg = m.segAt(dev, e.Ptr, e.Size); seg != nil {
			stream = seg.stream
		}
	}
	m.push(vizEntry{act: vizFree, ns: e.Timestamp, addr: e.Ptr, size: e.Size, stream: stream, stack: st,
		dev: dev, own: seg == nil})
}

func (m *memvizWriter) allocSeg(e *trace.Event, dev int16) {
	if e.Ptr == 0 {
		return
	}
	if old := m.segs[e.AllocID]; old != nil {
		m.freeSeg(old, e.Timestamp, -1)
	}
	l := m.segList[dev]
	i := sort.Search(len(l), func(i int) bool { return l[i].addr >= e.Ptr })
	if i < len(l) && l[i].addr == e.Ptr { // its free was never seen
		m.freeSeg(l[i], e.Timestamp, -1)
		l = m.segList[dev]
	}
	s := &vizSeg{addr: e.Ptr, size: e.Size, id: e.AllocID, dev: dev, stream: streamOf(e),
		stack: m.stacks.intern(eventStack(e))}
	l = append(l, nil)
	copy(l[i+1:], l[i:])
	l[i] = s
	m.segList[dev] = l
	m.segs[s.id] = s
	s.seq = m.push(vizEntry{act: vizSegAlloc, ns: e.Timestamp, addr: s.addr, size: s.size, stream: s.stream,
		stack: s.stack, dev: dev})
}

// freeSeg ends a live segment, and first the blocks still inside it (their
// frees were not seen: the viewer wants every block inside a segment).
func (m *memvizWriter) freeSeg(s *vizSeg, ns uint64, stack int32) {
	if s.blocks > 0 {
		var in []*vizBlock
		for _, b := range m.blocks {
			if b.seg == s {
				in = append(in, b)
			}
		}
		sort.Slice(in, func(i, j int) bool { return in[i].addr < in[j].addr })
		for _, b := range in {
			m.freeBlock(b, ns, -1)
		}
	}
	if stack < 0 {
		stack = s.stack
	}
	m.push(vizEntry{act: vizSegFree, ns: ns, addr: s.addr, size: s.size, stream: s.stream, stack: stack, dev: s.dev})
	if m.segs[s.id] == s {
		delete(m.segs, s.id)
	}
	l := m.segList[s.dev]
	for i := range l {
		if l[i] == s {
			m.segList[s.dev] = append(l[:i], l[i+1:]...)
			break
		}
	}
	m.stacks.drop(s.stack)
}

func (m *memvizWriter) freeSegEvent(e *trace.Event, dev int16) {
	st := m.stacks.intern(eventStack(e))
	defer m.stacks.drop(st)
	s := m.segs[e.AllocID]
	if s == nil && e.Ptr != 0 {
		l := m.segList[dev]
		i := sort.Search(len(l), func(i int) bool { return l[i].addr >= e.Ptr })
		if i < len(l) && l[i].addr == e.Ptr {
			s = l[i]
		}
	}
	if s != nil {
		m.freeSeg(s, e.Timestamp, st)
	} else if e.Ptr != 0 && e.Size != 0 { // allocated before the capture
		m.push(vizEntry{act: vizSegFree, ns: e.Timestamp, addr: e.Ptr, size: e.Size, stream: streamOf(e),
			stack: st, dev: dev})
	}
}
