package export

import (
	"io"
	"sort"
	"strings"
)

// vizOut is one segment of the snapshot's "segments": a HAL segment with
// the blocks inside it, or a block that is its own segment.
type vizOut struct {
	addr, size, stream uint64
	stack              int32
	dev                int // the device index
	blocks             []*vizBlock
}

// vizEnc writes the pickle, sharing each frame and stack once (memo).
type vizEnc struct {
	p      *pickler
	stacks *stackTab
	frameM map[string]uint32
	stackM map[int32]uint32
}

// Encode writes the snapshot; it ends the writer's life.
func (m *memvizWriter) Encode(w io.Writer) error {
	// Device indexes: CUDA ordinals as they are, host after them.
	hostIdx := int(m.maxDev) + 1
	nDev := hostIdx
	if m.host {
		nDev++
	}
	nDev = max(nDev, 1)
	idx := func(dev int16) int {
		if dev == vizHost {
			return hostIdx
		}
		return int(dev)
	}
	heads := m.heads(nDev, idx)
	segs := m.outSegments(idx)

	e := &vizEnc{p: newPickler(w), stacks: &m.stacks, frameM: map[string]uint32{}, stackM: map[int32]uint32{}}
	p := e.p
	p.dict(func(key func(string)) {
		key("segments")
		l := p.beginList()
		for _, s := range segs {
			l.next()
			e.segment(s)
		}
		l.end()
		key("device_traces")
		dl := p.beginList()
		for d := 0; d < nDev; d++ {
			dl.next()
			l := p.beginList()
			last := uint64(0) // time_us never goes back
			put := func(action string, x *vizEntry) {
				l.next()
				last = max(last, x.ns/1000)
				e.entry(action, x, last)
			}
			emit := func(x *vizEntry) {
				switch x.act {
				case vizAlloc:
					if x.own {
						put("segment_alloc", x)
					}
					put("alloc", x)
				case vizFree:
					put("free_requested", x)
					put("free_completed", x)
					if x.own {
						put("segment_free", x)
					}
				case vizSegAlloc:
					put("segment_alloc", x)
				case vizSegFree:
					put("segment_free", x)
				case vizOOM:
					put("oom", x)
				}
			}
			for i := range heads[d] {
				emit(&heads[d][i])
			}
			for i := range m.ring {
				if x := m.entry(i); idx(x.dev) == d {
					emit(x)
				}
			}
			l.end()
		}
		dl.end()
	})
	return p.finish()
}

// heads are, per device index, the allocs the kept trace lacks: of the
// blocks and segments it frees without allocating them, and of those
// alive at the end whose alloc fell out of it; segments first, at the time
// of the oldest entry kept.
func (m *memvizWriter) heads(nDev int, idx func(int16) int) [][]vizEntry {
	segH := make([][]vizEntry, nDev)
	blockH := make([][]vizEntry, nDev)
	var first uint64
	if len(m.ring) > 0 {
		first = m.entry(0).ns
	}
	open := map[addrKey]bool{}
	openSeg := map[addrKey]bool{}
	for i := range m.ring {
		x := m.entry(i)
		k := addrKey{x.dev, x.addr}
		switch x.act {
		case vizAlloc:
			open[k] = true
		case vizSegAlloc:
			openSeg[k] = true
		case vizFree:
			if open[k] {
				delete(open, k)
			} else {
				h := *x
				h.act, h.ns = vizAlloc, first
				blockH[idx(x.dev)] = append(blockH[idx(x.dev)], h)
			}
		case vizSegFree:
			if openSeg[k] {
				delete(openSeg, k)
			} else {
				h := *x
				h.act, h.ns = vizSegAlloc, first
				segH[idx(x.dev)] = append(segH[idx(x.dev)], h)
			}
		}
	}
	oldest := m.pushed - uint64(len(m.ring))
	for _, b := range aliveBefore(m.blocks, func(b *vizBlock) uint64 { return b.seq }, oldest) {
		blockH[idx(b.dev)] = append(blockH[idx(b.dev)], vizEntry{act: vizAlloc, ns: first, addr: b.addr,
			size: b.size, stream: b.stream, stack: b.stack, dev: b.dev, own: b.seg == nil})
	}
	for _, s := range aliveBefore(m.segs, func(s *vizSeg) uint64 { return s.seq }, oldest) {
		segH[idx(s.dev)] = append(segH[idx(s.dev)], vizEntry{act: vizSegAlloc, ns: first, addr: s.addr,
			size: s.size, stream: s.stream, stack: s.stack, dev: s.dev})
	}
	for d := range segH {
		segH[d] = append(segH[d], blockH[d]...)
	}
	return segH
}

// outSegments are the segments alive at the end, by device and address:
// each HAL segment with the blocks that tile it (a block overlapping
// another, a stale one, becomes its own segment), and each other block as
// its own segment.
func (m *memvizWriter) outSegments(idx func(int16) int) []*vizOut {
	in := map[*vizSeg][]*vizBlock{}
	var out []*vizOut
	own := func(b *vizBlock) {
		out = append(out, &vizOut{addr: b.addr, size: b.size, stream: b.stream, stack: b.stack, dev: idx(b.dev),
			blocks: []*vizBlock{b}})
	}
	for _, b := range m.blocks {
		if b.seg != nil && m.segs[b.seg.id] == b.seg {
			in[b.seg] = append(in[b.seg], b)
		} else {
			own(b)
		}
	}
	for _, l := range m.segList {
		for _, s := range l {
			bs := in[s]
			sort.Slice(bs, func(i, j int) bool { return bs[i].addr < bs[j].addr })
			o := &vizOut{addr: s.addr, size: s.size, stream: s.stream, stack: s.stack, dev: idx(s.dev)}
			end := s.addr
			for _, b := range bs {
				if b.addr < end || b.addr+b.size > s.addr+s.size {
					own(b)
					continue
				}
				o.blocks = append(o.blocks, b)
				end = b.addr + b.size
			}
			out = append(out, o)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].dev != out[j].dev {
			return out[i].dev < out[j].dev
		}
		if out[i].addr != out[j].addr {
			return out[i].addr < out[j].addr
		}
		return out[i].size < out[j].size
	})
	return out
}

// frames writes a stack's frames (innermost first, as PyTorch's), once;
// then a reference to that list.
func (e *vizEnc) frames(id int32) {
	p := e.p
	if id < 0 {
		p.op(opEmptyList)
		return
	}
	if i, ok := e.stackM[id]; ok {
		p.get(i)
		return
	}
	l := p.beginList()
	for _, f := range strings.Split(e.stacks.strs[id], ";") {
		l.next()
		if i, ok := e.frameM[f]; ok {
			p.get(i)
			continue
		}
		name, file, line := frameFunc(f)
		p.dict(func(key func(string)) {
			key("filename")
			p.mstr(file)
			key("line")
			p.int(line)
			key("name")
			p.mstr(name)
		})
		e.frameM[f] = p.put()
	}
	l.end()
	e.stackM[id] = p.put()
}

func (e *vizEnc) entry(action string, x *vizEntry, timeUs uint64) {
	p := e.p
	p.dict(func(key func(string)) {
		key("action")
		p.mstr(action)
		if x.act == vizOOM {
			key("device_free")
			p.uint(x.addr)
		} else {
			key("addr")
			p.uint(x.addr)
		}
		key("size")
		p.uint(x.size)
		key("stream")
		p.uint(x.stream)
		key("time_us")
		p.uint(timeUs)
		key("frames")
		e.frames(x.stack)
	})
}

func (e *vizEnc) segment(s *vizOut) {
	p := e.p
	var used uint64
	for _, b := range s.blocks {
		used += b.size
	}
	block := func(addr, size uint64, b *vizBlock) {
		p.dict(func(key func(string)) {
			key("address")
			p.uint(addr)
			key("size")
			p.uint(size)
			key("requested_size")
			if b != nil {
				p.uint(size)
			} else {
				p.int(0)
			}
			key("state")
			if b != nil {
				p.mstr("active_allocated")
			} else {
				p.mstr("inactive")
			}
			key("frames")
			if b != nil {
				e.frames(b.stack)
			} else {
				e.frames(-1)
			}
		})
	}
	p.dict(func(key func(string)) {
		key("device")
		p.int(int64(s.dev))
		key("address")
		p.uint(s.addr)
		key("total_size")
		p.uint(s.size)
		key("allocated_size")
		p.uint(used)
		key("active_size")
		p.uint(used)
		key("requested_size")
		p.uint(used)
		key("stream")
		p.uint(s.stream)
		key("segment_type")
		if s.size <= 1<<20 {
			p.mstr("small")
		} else {
			p.mstr("large")
		}
		key("segment_pool_id")
		p.tuple(2, func() { p.int(0); p.int(0) })
		key("is_expandable")
		p.boolean(false)
		key("frames")
		e.frames(s.stack)
		key("blocks")
		l := p.beginList()
		end := s.addr
		for _, b := range s.blocks { // in address order, tiling the segment
			if b.addr > end {
				l.next()
				block(end, b.addr-end, nil)
			}
			l.next()
			block(b.addr, b.size, b)
			end = b.addr + b.size
		}
		if end < s.addr+s.size {
			l.next()
			block(end, s.addr+s.size-end, nil)
		}
		l.end()
	})
}

// aliveBefore lists the live values whose alloc came before the oldest
// entry kept (seq < oldest), in the order of their allocs.
func aliveBefore[T any](live map[uint64]*T, seq func(*T) uint64, oldest uint64) []*T {
	var out []*T
	for _, v := range live {
		if seq(v) < oldest {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return seq(out[i]) < seq(out[j]) })
	return out
}
