package trace

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"strconv"
)

// Number formatting for the CSV writer, the conversion's hottest code: a
// row holds eight numbers. The output is strconv's, byte for byte; these
// write in place (no temporary, no copy) and skip what a row repeats.

const hexDigits = "0123456789abcdef"

var pow10 = [20]uint64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9,
	1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19}

// decLen is the number of decimal digits of v (1 for 0).
func decLen(v uint64) int {
	t := (bits.Len64(v|1) * 1233) >> 12 // ≈ log10, low by at most one
	if v >= pow10[t] {                  // t ≤ 19
		t++
	}
	return max(t, 1)
}

// grow makes room for n more bytes after len(b) and returns b extended by n.
func grow(b []byte, n int) []byte { return slices.Grow(b, n)[:len(b)+n] }

// appendUint is strconv.AppendUint(b, v, 10).
func appendUint(b []byte, v uint64) []byte {
	n := decLen(v)
	b = grow(b, n)
	putDec(b[len(b)-n:], v)
	return b
}

// putDec writes v's decimal digits right-aligned into d, which is exactly
// as long as they need (or longer: zero padding).
func putDec(d []byte, v uint64) {
	i := len(d)
	for ; i >= 3; i -= 3 {
		q := v / 1000
		j := (v - q*1000) * 4
		d[i-3], d[i-2], d[i-1] = digitTriples[j], digitTriples[j+1], digitTriples[j+2]
		v = q
	}
	j := v % 1000 * 4 // one or two digits left: a triple's tail
	switch i {
	case 2:
		d[0], d[1] = digitTriples[j+1], digitTriples[j+2]
	case 1:
		d[0] = digitTriples[j+2]
	}
}

// appendInt is strconv.AppendInt(b, v, 10).
func appendInt(b []byte, v int64) []byte {
	if v < 0 {
		return strconv.AppendInt(b, v, 10)
	}
	return appendUint(b, uint64(v))
}

// appendHex is strconv.AppendUint(b, v, 16), two digits a step.
func appendHex(b []byte, v uint64) []byte {
	n := max((bits.Len64(v)+3)/4, 1)
	b = grow(b, n)
	d := b[len(b)-n:]
	i := n
	for ; i >= 2; i -= 2 {
		j := (v & 0xff) * 2
		d[i-2], d[i-1] = hexPairs[j], hexPairs[j+1]
		v >>= 8
	}
	if i == 1 {
		d[0] = hexDigits[v&15]
	}
	return b
}

// hexPairs is "000102…feff": byte j's two hex digits at 2j.
var hexPairs = func() (t [512]byte) {
	for j := range 256 {
		t[2*j], t[2*j+1] = hexDigits[j>>4], hexDigits[j&15]
	}
	return t
}()

// highDigits is the cached part of a run of numbers: the digits of hi (a
// number's part above its low digits), and their first 16 bytes as words.
type highDigits struct {
	hi     uint64
	digits []byte // empty until the first number with a high part
	w0, w1 uint64
}

// set caches hi's digits, as format appends them, unless they are cached.
func (h *highDigits) set(hi uint64, format func([]byte, uint64) []byte) {
	if hi == h.hi && len(h.digits) > 0 {
		return
	}
	h.hi, h.digits = hi, format(h.digits[:0], hi)
	var w [16]byte
	copy(w[:], h.digits)
	h.w0, h.w1 = binary.LittleEndian.Uint64(w[:8]), binary.LittleEndian.Uint64(w[8:])
}

// words stores the cached digits at d (16 bytes: those past the digits are
// the low digits' place, or spare capacity) with two word stores instead of
// a copy call. (d must lie in a buffer of the caller's own, not in a window
// on another's.)
func (h *highDigits) words(d []byte) {
	binary.LittleEndian.PutUint64(d[:8], h.w0)
	binary.LittleEndian.PutUint64(d[8:16], h.w1)
}

// decRun formats a run of numbers that change mostly in their low digits
// (row ids, nanosecond stamps, allocation ids): the digits above the low
// three are formatted once per change and copied otherwise, so a row's
// number costs one three-digit step. (Stamps a few tens of ns apart change
// their thousands every ~50 rows; ids every 1000.)
type decRun struct{ highDigits }

const decRunLow = 1000

func (r *decRun) append(b []byte, v uint64) []byte {
	hi := v / decRunLow
	if hi == 0 {
		return appendUint(b, v)
	}
	r.set(hi, appendUint)
	j := (v - hi*decRunLow) * 4
	if len(r.digits) > 16 {
		b = append(b, r.digits...)
		return append(b, digitTriples[j], digitTriples[j+1], digitTriples[j+2])
	}
	b = slices.Grow(b, 16+decRunDigits)
	l, n := len(b), len(r.digits)
	r.words(b[l : l+16])
	b = b[:l+n+decRunDigits]
	b[l+n], b[l+n+1], b[l+n+2] = digitTriples[j], digitTriples[j+1], digitTriples[j+2]
	return b
}

// hexRun is decRun for hex addresses: blocks of one heap share all but their
// low six digits (16 MiB), which are formatted; the rest is copied.
type hexRun struct{ highDigits }

func (r *hexRun) append(b []byte, v uint64) []byte {
	hi := v >> 24
	if hi == 0 {
		return appendHex(b, v)
	}
	r.set(hi, appendHex) // (at most 10 digits: hi has 40 bits)
	b = slices.Grow(b, 16+6)
	l, n := len(b), len(r.digits)
	r.words(b[l : l+16])
	b = b[:l+n+6]
	lo := b[l+n:]
	i, j, k := (v>>15)&0x1fe, (v>>7)&0x1fe, (v<<1)&0x1fe // each byte's pair, at 2×byte
	lo[0], lo[1], lo[2], lo[3], lo[4], lo[5] = hexPairs[i], hexPairs[i+1], hexPairs[j], hexPairs[j+1], hexPairs[k], hexPairs[k+1]
	return b
}

// digitTriples holds 000 to 999, each in 4 bytes.
var digitTriples = func() (t [4000]byte) {
	for i := range 1000 {
		t[4*i], t[4*i+1], t[4*i+2] = byte('0'+i/100), byte('0'+i/10%10), byte('0'+i%10)
	}
	return t
}()

// decRunDigits is decRunLow's number of zeros.
const decRunDigits = 3
