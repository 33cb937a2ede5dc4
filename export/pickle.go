package export

import (
	"bufio"
	"encoding/binary"
	"io"
	"math"
)

// pickler writes a Python pickle (protocol 4's opcodes, without framing,
// which is optional) as a stream of opcodes, so that a large value is never
// built whole in memory: the caller walks its data and calls the methods in
// the order the unpickler's stack wants them. It writes only what Python's
// pickle.load and the JavaScript unpickler of PyTorch's memory_viz page
// both read: dict, list, tuple, str, int of any 64-bit value, float, bool,
// None, and the memo (BINPUT/BINGET) to share repeated strings and values.
// Lists and dicts are filled in batches of at most pickleBatch items, as
// Python's pickler does (the JavaScript unpickler spreads a batch into a
// call's arguments, which a few hundred thousand would overflow).
type pickler struct {
	w    *bufio.Writer
	err  error
	memo uint32            // the next memo index
	strs map[string]uint32 // memoized strings
	buf  [10]byte
}

const pickleBatch = 1000

// Pickle opcodes (Python's Lib/pickle.py).
const (
	opProto       = 0x80
	opStop        = '.'
	opNone        = 'N'
	opNewTrue     = 0x88
	opNewFalse    = 0x89
	opBinInt      = 'J'
	opBinInt1     = 'K'
	opBinInt2     = 'M'
	opLong1       = 0x8a
	opBinFloat    = 'G'
	opShortBinStr = 0x8c // SHORT_BINUNICODE
	opBinUnicode  = 'X'
	opEmptyDict   = '}'
	opEmptyList   = ']'
	opEmptyTuple  = ')'
	opMark        = '('
	opTuple       = 't'
	opTuple1      = 0x85
	opTuple2      = 0x86
	opTuple3      = 0x87
	opSetItems    = 'u'
	opAppends     = 'e'
	opBinPut      = 'q'
	opLongBinPut  = 'r'
	opBinGet      = 'h'
	opLongBinGet  = 'j'
)

func newPickler(w io.Writer) *pickler {
	p := &pickler{w: bufio.NewWriterSize(w, 1<<16), strs: map[string]uint32{}}
	p.op(opProto)
	p.byte(4)
	return p
}

func (p *pickler) byte(b byte) {
	if p.err == nil {
		p.err = p.w.WriteByte(b)
	}
}

func (p *pickler) op(b byte) { p.byte(b) }

func (p *pickler) bytes(b []byte) {
	if p.err == nil {
		_, p.err = p.w.Write(b)
	}
}

func (p *pickler) u32(v uint32) {
	binary.LittleEndian.PutUint32(p.buf[:4], v)
	p.bytes(p.buf[:4])
}

// finish writes STOP and flushes; it returns the first error met.
func (p *pickler) finish() error {
	p.op(opStop)
	if p.err == nil {
		p.err = p.w.Flush()
	}
	return p.err
}

func (p *pickler) none() { p.op(opNone) }

func (p *pickler) boolean(b bool) {
	if b {
		p.op(opNewTrue)
	} else {
		p.op(opNewFalse)
	}
}

// int writes v as Python's pickler does: BININT1, BININT2 or BININT when it
// fits, else LONG1 with the fewest little-endian two's complement bytes.
func (p *pickler) int(v int64) {
	switch {
	case v >= 0 && v < 1<<8:
		p.op(opBinInt1)
		p.byte(byte(v))
	case v >= 0 && v < 1<<16:
		p.op(opBinInt2)
		p.byte(byte(v))
		p.byte(byte(v >> 8))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		p.op(opBinInt)
		p.u32(uint32(int32(v)))
	default:
		n := 0
		for x := v; ; {
			p.buf[n] = byte(x)
			n++
			x >>= 8 // arithmetic: -1 stays -1
			if (x == 0 && p.buf[n-1] < 0x80) || (x == -1 && p.buf[n-1] >= 0x80) {
				break
			}
		}
		p.op(opLong1)
		p.byte(byte(n))
		p.bytes(p.buf[:n])
	}
}

// uint writes v, which may exceed int64 (LONG1 of 9 bytes then).
func (p *pickler) uint(v uint64) {
	if v <= math.MaxInt64 {
		p.int(int64(v))
		return
	}
	binary.LittleEndian.PutUint64(p.buf[:8], v)
	p.buf[8] = 0 // positive: a zero sign byte
	p.op(opLong1)
	p.byte(9)
	p.bytes(p.buf[:9])
}

func (p *pickler) float(f float64) {
	p.op(opBinFloat)
	binary.BigEndian.PutUint64(p.buf[:8], math.Float64bits(f))
	p.bytes(p.buf[:8])
}

// str writes s (UTF-8, as Go strings are; invalid bytes are the caller's).
func (p *pickler) str(s string) {
	if len(s) < 256 {
		p.op(opShortBinStr)
		p.byte(byte(len(s)))
	} else {
		p.op(opBinUnicode)
		p.u32(uint32(len(s)))
	}
	if p.err == nil {
		_, p.err = p.w.WriteString(s)
	}
}

// mstr writes s, or a reference to its first copy: one object in Python.
func (p *pickler) mstr(s string) {
	if i, ok := p.strs[s]; ok {
		p.get(i)
		return
	}
	p.str(s)
	p.strs[s] = p.put()
}

// put memoizes the value on top of the stack and returns its memo index.
func (p *pickler) put() uint32 {
	i := p.memo
	p.memo++
	p.memoOp(opBinPut, opLongBinPut, i)
	return i
}

// get pushes the value memoized at index i.
func (p *pickler) get(i uint32) { p.memoOp(opBinGet, opLongBinGet, i) }

// memoOp writes a memo opcode with index i: its one-byte form when i fits.
func (p *pickler) memoOp(short, long byte, i uint32) {
	if i < 256 {
		p.op(short)
		p.byte(byte(i))
	} else {
		p.op(long)
		p.u32(i)
	}
}

// listWriter fills a list in batches; next comes before each item.
type listWriter struct {
	p *pickler
	n int // items in the open batch
}

// beginList starts a list; its items follow, each after next, then end.
func (p *pickler) beginList() *listWriter {
	p.op(opEmptyList)
	p.op(opMark)
	return &listWriter{p: p}
}

func (l *listWriter) next() {
	if l.n == pickleBatch {
		l.p.op(opAppends)
		l.p.op(opMark)
		l.n = 0
	}
	l.n++
}

func (l *listWriter) end() { l.p.op(opAppends) }

// dict writes a dict of the pairs fill writes through key (a memoized str
// key, then the value: at most pickleBatch pairs).
func (p *pickler) dict(fill func(key func(string))) {
	p.op(opEmptyDict)
	p.op(opMark)
	fill(p.mstr)
	p.op(opSetItems)
}

// tuple writes the tuple of the n values items writes.
func (p *pickler) tuple(n int, items func()) {
	switch n {
	case 0:
		p.op(opEmptyTuple)
	case 1, 2, 3:
		items()
		p.op([]byte{opTuple1, opTuple2, opTuple3}[n-1])
	default:
		p.op(opMark)
		items()
		p.op(opTuple)
	}
}
