package cenc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"msmemscope/format"
	"msmemscope/spool"
)

// Every record the hook writes goes through libmemscope/records.h: here each
// form is encoded by that C code and decoded by the Go reader, field by field.

// want is what the decoder must give for an encoded event.
type want struct {
	kind, flags uint16
	ts, a, b    uint64
	site        uint32
	payload     []byte // without the padding to whole units
}

func check(t *testing.T, what string, r spool.Rec, w want) {
	t.Helper()
	if r.Kind != w.kind || r.Flags != w.flags || r.TS != w.ts || r.A != w.a || r.B != w.b || r.Site != w.site {
		t.Errorf("%s: decoded {kind %d flags %#x ts %#x a %#x b %#x site %d}, want {kind %d flags %#x ts %#x a %#x b %#x site %d}",
			what, r.Kind, r.Flags, r.TS, r.A, r.B, r.Site, w.kind, w.flags, w.ts, w.a, w.b, w.site)
	}
	pad := (8 - len(w.payload)%8) % 8
	if !bytes.Equal(r.Payload, append(append([]byte(nil), w.payload...), make([]byte, pad)...)) {
		t.Errorf("%s: payload %x, want %x and %d zero bytes", what, r.Payload, w.payload, pad)
	}
}

// decode decodes b, which must hold exactly one event, both ways the reader
// does (DecodeRec and a thread's Decoder), and checks its size both sides.
func decode(t *testing.T, what string, b []byte, epoch uint64, site uint32) spool.Rec {
	t.Helper()
	r, size, ok := spool.DecodeRec(b, epoch, site)
	if !ok || size != len(b) {
		t.Fatalf("%s: DecodeRec size %d ok %v, encoded %d bytes", what, size, ok, len(b))
	}
	if u := Units(b); u*8 != len(b) {
		t.Errorf("%s: the drain's rec_units says %d units, encoded %d bytes", what, u, len(b))
	}
	d := spool.RecDecoder{Epoch: epoch, Site: site}
	r2, size2, ok2 := d.Next(b)
	if !ok2 || size2 != size || r2.Kind != r.Kind || r2.A != r.A || r2.B != r.B || r2.TS != r.TS || r2.Site != r.Site || r2.Flags != r.Flags {
		t.Errorf("%s: Decoder.Next %+v (%d), DecodeRec %+v (%d)", what, r2, size2, r, size)
	}
	return r
}

var allKinds = []uint16{
	format.RMalloc, format.RFree, format.RMark, format.RRangeStart, format.RRangeEnd, format.RStart, format.RStop,
	format.RStep, format.RExit, format.RCalib, format.RExec, format.RFork, format.RLost, format.RSite, format.REpoch,
	format.RStack, format.RPyCode, format.RPySkip, format.RConfig, format.RDescribe, format.ROwnerPush,
	format.ROwnerPop, format.ROpStart, format.ROpEnd, format.RSnapshot, format.RWatch, format.RTag,
}

func TestFullRecords(t *testing.T) {
	payloads := [][]byte{nil, []byte("x"), []byte("exactly8"), []byte("aten::add\nREAD 0x7f00 64\n"), bytes.Repeat([]byte{0xab}, 1000)}
	for _, kind := range allKinds {
		for i, p := range payloads {
			flags := uint16(format.FText)
			if p == nil {
				flags = 0
			}
			site := uint32(0)
			if kind == format.RMalloc {
				site, flags = 0xffff, flags|format.FHost|format.FOff
			}
			w := want{kind: kind, flags: flags, ts: 0x0123456789abcdef, a: 0xfedcba9876543210, b: uint64(len(p)), site: site, payload: p}
			what := fmt.Sprintf("kind %d payload %d", kind, i)
			b := Full(w.kind, w.flags, w.ts, w.a, w.b, w.site, p)
			if len(b) != 8*CSide.RecUnits+(len(p)+7)/8*8 {
				t.Fatalf("%s: %d bytes", what, len(b))
			}
			r := decode(t, what, b, 0, 0)
			check(t, what, r, w)
			if p != nil && r.Text() != string(p) {
				t.Errorf("%s: text %q", what, r.Text())
			}
			if spool.NeedsPast(b) {
				t.Errorf("%s: a full record needs no past", what)
			}
		}
	}
	// The stamp of an epoch-stamped record and the largest payload.
	big := bytes.Repeat([]byte{1}, CSide.MaxPayload)
	r := decode(t, "max payload", Full(format.RExec, format.FText, format.TSEpoch|42, 0, uint64(len(big)), 0, big), 0, 0)
	check(t, "max payload", r, want{kind: format.RExec, flags: format.FText, ts: format.TSEpoch | 42, b: uint64(len(big)), payload: big})
}

func TestStacks(t *testing.T) {
	frames := []uint64{0x401234, 0x7f0000001000, 0x402000}
	var p []byte
	for _, f := range frames {
		p = binary.LittleEndian.AppendUint64(p, f)
	}
	// R_STACK, and a whole C stack on a MALLOC.
	r := decode(t, "R_STACK", Full(format.RStack, format.FCStack, 99, 7, 3, 0, p), 0, 0)
	check(t, "R_STACK", r, want{kind: format.RStack, flags: format.FCStack, ts: 99, a: 7, b: 3, payload: p})
	if got := r.Frames(); fmt.Sprint(got) != fmt.Sprint(frames) {
		t.Errorf("R_STACK frames %x, want %x", got, frames)
	}
	r = decode(t, "MALLOC with C stack", Full(format.RMalloc, format.FHost|format.FCStack, 5, 0x1000, 64, 12, p), 0, 0)
	if c, py := r.Stacks(); fmt.Sprint(c) != fmt.Sprint(frames) || py != nil {
		t.Errorf("C stack: %x %v", c, py)
	}
	// A Python stack, with and without C frames (pystack.h's payload).
	for _, nc := range []int{0, 2} {
		py := []spool.PyFrame{{Code: 1, Lasti: 10}, {Code: 0xffffffff, Lasti: -1}, {Code: 3, Lasti: 0x7fffffff}}
		p := binary.LittleEndian.AppendUint64(nil, PyStackHead(uint32(nc), uint32(len(py))))
		for _, f := range frames[:nc] {
			p = binary.LittleEndian.AppendUint64(p, f)
		}
		for _, f := range py {
			p = binary.LittleEndian.AppendUint64(p, PyFrame(f.Code, f.Lasti))
		}
		flags := uint16(format.FHost | format.FPyStack)
		if nc > 0 {
			flags |= format.FCStack
		}
		r := decode(t, "MALLOC with Python stack", Full(format.RMalloc, flags, 5, 0x1000, 64, 12, p), 0, 0)
		c, gotPy := r.Stacks()
		if fmt.Sprint(c) != fmt.Sprint(frames[:nc]) || fmt.Sprint(gotPy) != fmt.Sprint(py) {
			t.Errorf("Python stack (%d C frames): %x %v, want %x %v", nc, c, gotPy, frames[:nc], py)
		}
	}
}

func TestPyCode(t *testing.T) {
	file, name, qual, lt := "/srv/train.py", "step", "Model.step", []byte{0x80, 0x00, 0xd8, 0x04}
	p := PyCodeHead(77, 120, -3, uint16(len(file)), uint16(len(name)), uint16(len(qual)), format.PyLTPEP626, uint32(len(lt)))
	if len(p) != format.PyCodeSize {
		t.Fatalf("ms_pycode: C %d bytes, records.def %d", len(p), format.PyCodeSize)
	}
	p = append(append(append(append(p, file...), name...), qual...), lt...)
	r := decode(t, "R_PYCODE", Full(format.RPyCode, format.FText, 1, 77, uint64(len(p)), 0, p), 0, 0)
	check(t, "R_PYCODE", r, want{kind: format.RPyCode, flags: format.FText, ts: 1, a: 77, b: uint64(len(p)), payload: p})
	c, ok := spool.ParsePyCode(r.Payload)
	if !ok || c.ID != 77 || c.FirstLine != 120 || c.FirstTraceable != -3 || c.LineTableFormat != format.PyLTPEP626 || c.File != file || c.Name != name || c.QualName != qual || !bytes.Equal(c.LineTable, lt) {
		t.Errorf("ParsePyCode: %+v %v", c, ok)
	}
}

func TestCompactRecords(t *testing.T) {
	const epoch = 0x123456789a
	for _, c := range []struct {
		flags     uint16
		ptr, size uint64
		site      uint32
	}{
		{format.FHost, 0x55550000a010, 24, 1},
		{format.FHost | format.FOff, format.CompactMax, format.CompactMax, 0xffff},
		{format.FMmap, 0x7f0000000000, 1 << 30, 0},
		{format.FHost | format.FUndo, 0x1000, 0, 77},
	} {
		what := fmt.Sprintf("compact MALLOC %+v", c)
		b := Malloc(c.flags, c.ptr, c.size, c.site)
		if len(b) != 16 || spool.NeedsPast(b) {
			t.Errorf("%s: %d bytes, needs past %v", what, len(b), spool.NeedsPast(b))
		}
		check(t, what, decode(t, what, b, epoch, 9), want{kind: format.RMalloc, flags: c.flags, ts: format.TSEpoch | epoch, a: c.ptr, b: c.size, site: c.site})

		what = fmt.Sprintf("stack-id MALLOC %+v", c)
		fl := c.flags | format.FCStack | format.FStackID
		b = MallocID(fl, c.ptr, c.size, c.site, 0x3ffff)
		id := binary.LittleEndian.AppendUint64(nil, 0x3ffff)
		check(t, what, decode(t, what, b, epoch, 9), want{kind: format.RMalloc, flags: fl, ts: format.TSEpoch | epoch, a: c.ptr, b: c.size, site: c.site, payload: id})

		what = fmt.Sprintf("compact FREE %+v", c)
		b = Free(c.flags, c.ptr)
		if len(b) != 8 || spool.NeedsPast(b) {
			t.Errorf("%s: %d bytes, needs past %v", what, len(b), spool.NeedsPast(b))
		}
		check(t, what, decode(t, what, b, epoch, 9), want{kind: format.RFree, flags: c.flags, ts: format.TSEpoch | epoch, a: c.ptr})
	}
}

func TestShortMalloc(t *testing.T) {
	for _, c := range []struct {
		ptr, size uint64
		off       bool
	}{{0x10, 0, false}, {0x55550000a010, 1000, true}, {1<<47 - 16, format.CompactShortSize - 1, false}} {
		what := fmt.Sprintf("short MALLOC %+v", c)
		if !ShortFits(c.ptr, c.size) {
			t.Fatalf("%s: does not fit", what)
		}
		b := Short(c.ptr, c.size, c.off)
		if len(b) != 8 || !spool.NeedsPast(b) {
			t.Errorf("%s: %d bytes, needs past %v", what, len(b), spool.NeedsPast(b))
		}
		flags := uint16(format.FHost)
		if c.off {
			flags |= format.FOff
		}
		check(t, what, decode(t, what, b, 5, 321), want{kind: format.RMalloc, flags: flags, ts: format.TSEpoch | 5, a: c.ptr, b: c.size, site: 321})
	}
	for _, c := range [][2]uint64{{0x18, 8}, {1 << 47, 8}, {0x10, format.CompactShortSize}} {
		if ShortFits(c[0], c[1]) {
			t.Errorf("short MALLOC at %#x of %d fits", c[0], c[1])
		}
	}
}

// A pair unit's halves decode relative to the thread's last compact address.
func TestPairUnits(t *testing.T) {
	const last, site, epoch = 0x55550000a000, 44, 3
	type half struct {
		malloc bool
		d      int64
		size   uint64
	}
	halves := []half{
		{true, 0x40, 24}, {false, 0, 0}, {true, -format.PairMNear, format.PairMSize - 1}, {true, format.PairMNear - 16, 0},
		{false, -(1 << 31), 0}, {false, 1<<31 - 16, 0}, {false, 0x1230, 0},
	}
	enc := func(h half) uint32 {
		if h.malloc {
			if !HalfMallocFits(uint64(h.d), h.size) {
				t.Fatalf("%+v: no MALLOC half", h)
			}
			return HalfMalloc(uint64(h.d), h.size)
		}
		if !HalfFreeFits(uint64(h.d)) {
			t.Fatalf("%+v: no FREE half", h)
		}
		return HalfFree(uint64(h.d))
	}
	wantRec := func(h half, base uint64) want {
		w := want{kind: format.RFree, flags: format.FHost, ts: format.TSEpoch | epoch, a: base + uint64(h.d)}
		if h.malloc {
			w.kind, w.b, w.site = format.RMalloc, h.size, site
		}
		return w
	}
	for i, h1 := range halves {
		for j, h2 := range halves {
			// Both halves.
			s := enc(h2)
			b := Pair(enc(h1), &s)
			if !spool.NeedsPast(b) || Units(b) != 1 {
				t.Errorf("pair: needs past %v, %d units", spool.NeedsPast(b), Units(b))
			}
			d := spool.RecDecoder{Epoch: epoch, Site: site, Ptr: last}
			r1, n1, ok1 := d.Next(b)
			r2, n2, ok2 := d.Next(b)
			if !ok1 || !ok2 || n1 != 0 || n2 != 8 {
				t.Fatalf("pair %d,%d: sizes %d %d", i, j, n1, n2)
			}
			check(t, fmt.Sprintf("pair %d,%d first", i, j), r1, wantRec(h1, last))
			check(t, fmt.Sprintf("pair %d,%d second", i, j), r2, wantRec(h2, last+uint64(h1.d)))
		}
		// The first half alone (the unit went out before a second came).
		d := spool.RecDecoder{Epoch: epoch, Site: site, Ptr: last}
		r, n, ok := d.Next(Pair(enc(h1), nil))
		if !ok || n != 8 {
			t.Fatalf("lone half %d: size %d", i, n)
		}
		check(t, fmt.Sprintf("lone half %d", i), r, wantRec(h1, last))
		if d.Ptr != last+uint64(h1.d) {
			t.Errorf("lone half %d: decoder's last address %#x", i, d.Ptr)
		}
	}
	// Past the halves' reach.
	for _, c := range []struct {
		d    int64
		size uint64
	}{{format.PairMNear, 8}, {-format.PairMNear - 16, 8}, {0x10, format.PairMSize}, {8, 8}} {
		if HalfMallocFits(uint64(c.d), c.size) {
			t.Errorf("MALLOC half d=%d size %d fits", c.d, c.size)
		}
	}
	for _, d := range []int64{1 << 31, -(1 << 31) - 16, 8} {
		if HalfFreeFits(uint64(d)) {
			t.Errorf("FREE half d=%d fits", d)
		}
	}
}

// A spool whose chunks and events all come from the C encoders reads back
// through the Go spool reader: chunk and padding magics, epochs, sites,
// stack ids, a thread's past (short MALLOCs and pair units).
func TestSpoolFromCEncoders(t *testing.T) {
	const tid, pid, site, siteRA, stackID = 41, 4000, 7, 0x401000, 3
	frames := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 0x401234), 0x402345)
	var ev [][]byte
	add := func(b []byte) { ev = append(ev, b) }
	add(Full(format.RCalib, format.FEpoch, 1000, 1000, 1, 0, nil))
	add(Full(format.REpoch, 0, format.TSEpoch|1, 0, 0, 0, nil))
	add(Full(format.RSite, 0, 1001, siteRA, site, 0, nil))
	add(Full(format.RStack, format.FCStack, 1002, stackID, 2, 0, frames))
	add(Full(format.RMalloc, format.FHost, 1003, 0x10000, 100, site, nil)) // a precise stamp
	add(Malloc(format.FHost, 0x20000, 200, site))
	add(MallocID(format.FHost|format.FCStack|format.FStackID, 0x30000, 300, site, stackID))
	add(Short(0x40000, 400, false))
	s := HalfFree(uint64(0x40000 - 0x40000))
	add(Pair(HalfMalloc(0x100, 16), &s)) // MALLOC 0x40100 16, FREE 0x40100
	add(Free(format.FHost, 0x20000))
	add(Full(format.RExit, 0, 1010, 0, 0, 0, nil))
	add(Full(format.RCalib, format.FEpoch, 2000, 2000, 2, 0, nil))

	var sp bytes.Buffer
	if err := spool.WriteHeader(&sp, pid); err != nil {
		t.Fatal(err)
	}
	body := bytes.Join(ev, nil)
	sp.Write(Chunk(uint32(CSide.ChunkMagic), uint32(len(body)/8), tid, body))
	sp.Write(body)
	sp.Write(Pad(4096 - sp.Len()%4096))
	rd, err := spool.New(bytes.NewReader(sp.Bytes()), int64(sp.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if rd.Pid != pid || rd.Sites[site] != siteRA || rd.Truncated || rd.PadBytes == 0 || sp.Len()%4096 != 0 {
		t.Fatalf("spool: pid %d sites %v truncated %v pad %d", rd.Pid, rd.Sites, rd.Truncated, rd.PadBytes)
	}
	type ev2 struct {
		kind uint16
		a, b uint64
	}
	var got []ev2
	r := rd.Reader()
	for rec, _, err := r.Next(); rec != nil || err != nil; rec, _, err = r.Next() {
		if err != nil {
			t.Fatal(err)
		}
		if rec.Tid != tid {
			t.Errorf("tid %d", rec.Tid)
		}
		if rec.Kind == format.RMalloc && rec.A == 0x30000 {
			if c, _ := rec.Stacks(); fmt.Sprint(c) != "[4198964 4203333]" {
				t.Errorf("stack id not expanded: %v (flags %#x)", c, rec.Flags)
			}
		}
		if rec.Kind == format.RMalloc || rec.Kind == format.RFree || rec.Kind == format.RExit {
			got = append(got, ev2{rec.Kind, rec.A, rec.B})
		}
	}
	wantEv := []ev2{{format.RMalloc, 0x10000, 100}, {format.RMalloc, 0x20000, 200}, {format.RMalloc, 0x30000, 300},
		{format.RMalloc, 0x40000, 400}, {format.RMalloc, 0x40100, 16}, {format.RFree, 0x40100, 0}, {format.RFree, 0x20000, 0},
		{format.RExit, 0, 0}}
	if fmt.Sprint(got) != fmt.Sprint(wantEv) {
		t.Errorf("events %v\nwant   %v", got, wantEv)
	}
}

// The C header and the Go constants come from the same table.
func TestConstants(t *testing.T) {
	if c := CSide; c.ChunkMagic != format.ChunkMagic || c.PadMagic != format.PadMagic || c.RecUnits != format.RecUnits || c.PyCodeSize != format.PyCodeSize || c.MaxPayload != format.RecNMask*8 {
		t.Error("records_gen.h and format/records_gen.go disagree: run make generate")
	}
	if Tag(format.FHost|format.FOff) != format.CompactBit|uint64(format.FHost|format.FOff)<<48 {
		t.Errorf("tag %#x", Tag(format.FHost|format.FOff))
	}
}

// Stamp units give the next compact record its stamp; stamped halves carry
// their own, relative to the thread's last stamp, and their address
// relative to its last compact record's.
func TestStampUnits(t *testing.T) {
	const last, site, epoch = 0x55550000a000, 44, 3
	const ts0 = format.PairStampMax - 5 // the largest stamps still fit
	var b []byte
	b = append(b, Stamp(ts0)...)
	b = append(b, Malloc(format.FHost, last+0x100, 64, site)...)
	b = append(b, StampedHalf(format.PairStampDMax, HalfFree(0))...)               // the MALLOC just made
	b = append(b, StampedHalf(7, HalfMalloc(uint64(0x40), format.PairMSize-1))...) // at the same site, near
	b = append(b, Stamp(12)...)
	b = append(b, Free(format.FHost, 0x7000)...)
	d := spool.RecDecoder{Epoch: epoch, Site: site, Ptr: last}
	wants := []want{
		{kind: format.RMalloc, flags: format.FHost, ts: ts0, a: last + 0x100, b: 64, site: site},
		{kind: format.RFree, flags: format.FHost, ts: ts0 + format.PairStampDMax, a: last + 0x100},
		{kind: format.RMalloc, flags: format.FHost, ts: ts0 + format.PairStampDMax + 7, a: last + 0x140, b: format.PairMSize - 1, site: site},
		{kind: format.RFree, flags: format.FHost, ts: 12, a: 0x7000},
	}
	var got []spool.Rec
	for len(b) > 0 {
		if u := Units(b); u != 1 && u != 2 {
			t.Fatalf("%d units at %x", u, b[:8])
		}
		r, n, ok := d.Next(b)
		if !ok || n == 0 {
			t.Fatalf("decode stopped: %v %d", ok, n)
		}
		b = b[n:]
		if r.Kind != spool.NoEvent {
			got = append(got, r)
		}
	}
	if len(got) != len(wants) {
		t.Fatalf("got %d events, want %d", len(got), len(wants))
	}
	for i := range wants {
		check(t, fmt.Sprintf("event %d", i), got[i], wants[i])
	}
	if spool.NeedsPast(Stamp(1)) || !spool.NeedsPast(StampedHalf(1, HalfFree(0))) {
		t.Error("a stamp unit stands alone; a stamped half needs its thread's past")
	}
}

// The drain's chunk checksum, by the CPU's instruction and bit by bit, is
// the reader's (spool.ChunkCRC) for the thread id and the units.
func TestChunkCRCAgrees(t *testing.T) {
	for _, n := range []int{1, 2, 7, 64, 1000} {
		b := make([]byte, 8*n)
		for i := range b {
			b[i] = byte(i*131 + n)
		}
		tid := int32(-n * 1000003) // (a drain mark's tid is negative)
		want := spool.ChunkCRC(tid, b)
		if hw, soft := CRC(tid, b, false), CRC(tid, b, true); hw != want || soft != want {
			t.Errorf("%d units: drain %#x, bit by bit %#x, reader %#x", n, hw, soft, want)
		}
	}
}
