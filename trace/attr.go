package trace

import (
	"errors"
	"fmt"
	"strconv"
)

// Attr keys that map to typed Event fields.
const (
	attrAllocID     = "allocation_id"
	attrAddr        = "addr"
	attrSize        = "size"
	attrOwner       = "owner"
	attrInefficient = "inefficient"
	attrShadow      = "shadow"
	attrMstxID      = "id"
)

// ParseAttrInto parses an Attr column value ("{k:v,k:v}", SPEC §2.1) into e,
// whose Kind must already be set. It is the inverse of AppendAttr:
//
//   - MALLOC: allocation_id, addr, size, owner, inefficient and shadow go to
//     AllocID, Ptr (HasPtr set), Size, Owner, Inefficient and Shadow.
//   - FREE: allocation_id, addr and size, likewise.
//   - MSTX: id goes to MstxID.
//   - ACCESS: allocation_id and size are copied to AllocID and Size and also
//     kept in Extra, since AppendAttr writes ACCESS attributes from Extra only.
//   - Every other pair goes to Extra, in order.
//
// allocation_id, addr and size are required for MALLOC and FREE, id for MSTX;
// numbers are decimal except addr ("0x" and hex digits). The Attr-derived fields
// of e are reset first. Errors: missing braces, a pair without ':', an empty
// key, '{' or '}' inside the braces, a bad number, a typed key given twice, a
// required key missing. Extra values share memory with s.
//
// A successful parse re-formats with e.AppendAttr into a canonical form
// (typed keys first) that parses back to the same fields.
func ParseAttrInto(e *Event, s string) error {
	return parseAttr(e, s, identity, identity)
}

func identity(s string) string { return s }

// parseAttr is ParseAttrInto over a string or a byte slice. key makes the
// strings that repeat from row to row (Extra keys, owner, inefficient), val
// the other Extra values, so that a reader can intern the former and copy the
// latter.
func parseAttr[T string | []byte](e *Event, s T, key, val func(T) string) error {
	e.AllocID, e.Size, e.Owner, e.Inefficient, e.Shadow, e.MstxID = 0, 0, "", "", false, 0
	e.Extra = nil
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return attrError(s, "missing braces")
	}
	body := s[1 : len(s)-1]
	var seen uint16 // typed keys seen, a bit per key
	if len(body) == 0 {
		return required(e, s, seen)
	}
	// One pass: a pair ends at ',' or at the end; its key at the first ':'.
	pairStart, colon := 0, -1
	for i := 0; i <= len(body); i++ {
		if i < len(body) {
			c := body[i]
			if attrSpecial[c] == 0 {
				continue
			}
			switch c {
			case ':':
				if colon >= 0 {
					continue
				}
				colon = i
				// Fast path for a numeric typed key: parse the value in
				// place and skip to the next pair. Anything unusual falls
				// back to the general path, which reports it.
				bit, typed := typedKey(e.Kind, body[pairStart:colon])
				if bit&bitsNumeric == 0 || (typed && seen&bit != 0) {
					continue
				}
				n, j, ok := scanNumber(body, i+1, bit == bitAddr)
				if !ok || (j < len(body) && body[j] != ',') {
					continue
				}
				setNumeric(e, bit, n)
				if typed {
					seen |= bit
				} else {
					e.Extra = appendExtra(e.Extra, body, j, key(body[pairStart:colon]), val(body[i+1:j]))
				}
				i = j // the loop steps past the ','
				pairStart, colon = j+1, -1
				continue
			case '{', '}':
				return attrError(s, fmt.Sprintf("unexpected %q inside the braces", c))
			}
		}
		pair := body[pairStart:i]
		if colon < 0 {
			return attrError(s, fmt.Sprintf("pair %q without ':'", string(pair)))
		}
		if colon == pairStart {
			return attrError(s, fmt.Sprintf("empty key in %q", string(pair)))
		}
		k, v := body[pairStart:colon], body[colon+1:i]
		pairStart, colon = i+1, -1
		bit, typed := typedKey(e.Kind, k)
		if typed {
			if seen&bit != 0 {
				return attrError(s, fmt.Sprintf("duplicate key %q", string(k)))
			}
			seen |= bit
		}
		if err := setTyped(e, s, k, v, bit, key); err != nil {
			return err
		}
		if !typed {
			e.Extra = appendExtra(e.Extra, body, i, key(k), val(v))
		}
	}
	return required(e, s, seen)
}

// appendExtra appends k:v to extra; at the first, it sizes extra for the
// pairs left in body after position i.
func appendExtra[T string | []byte](extra []KV, body T, i int, k, v string) []KV {
	if extra == nil {
		n := 1 // this pair and those left
		for j := i; j < len(body); j++ {
			if body[j] == ',' {
				n++
			}
		}
		extra = make([]KV, 0, n)
	}
	return append(extra, KV{k, v})
}

// scanNumber parses the digits of body from i on (decimal, or "0x" and hex
// when hex) and returns the value and the index after them. ok is false when
// there are no digits or the value overflows.
func scanNumber[T string | []byte](body T, i int, hex bool) (n uint64, j int, ok bool) {
	j = i
	if hex {
		if j+2 > len(body) || body[j] != '0' || (body[j+1] != 'x' && body[j+1] != 'X') {
			return 0, i, false
		}
		j += 2
		start := j
		for ; j < len(body); j++ {
			c, ok := hexVal(body[j])
			if !ok {
				return n, j, j > start && j-start <= 16
			}
			n = n<<4 | uint64(c)
		}
		return n, j, j > start && j-start <= 16
	}
	for ; j < len(body); j++ {
		c := body[j] - '0'
		if c > 9 {
			break
		}
		n = n*10 + uint64(c)
	}
	return n, j, j > i && j-i <= 19
}

// setNumeric stores the value of a numeric typed key (a bit of bitsNumeric).
func setNumeric(e *Event, bit uint16, n uint64) {
	switch bit {
	case bitAllocID, bitAccessAllocID:
		e.AllocID = n
	case bitSize, bitAccessSize:
		e.Size = n
	case bitMstxID:
		e.MstxID = n
	case bitAddr:
		e.Ptr, e.HasPtr = n, true
	}
}

// attrSpecial marks the bytes the Attr parser stops at.
var attrSpecial = [256]uint8{',': 1, ':': 1, '{': 1, '}': 1}

const (
	bitAllocID = 1 << iota
	bitAddr
	bitSize
	bitOwner
	bitInefficient
	bitShadow
	bitMstxID
	bitAccessAllocID // ACCESS: parsed into AllocID, kept in Extra
	bitAccessSize

	bitsNumeric = bitAllocID | bitAddr | bitSize | bitMstxID | bitAccessAllocID | bitAccessSize
)

// typedKey reports which typed field k maps to for kind. The ACCESS bits are
// returned with typed false: the pair also goes to Extra.
func typedKey[T string | []byte](kind Kind, k T) (uint16, bool) {
	switch kind {
	case KindMalloc, KindFree:
		switch string(k) {
		case attrAllocID:
			return bitAllocID, true
		case attrAddr:
			return bitAddr, true
		case attrSize:
			return bitSize, true
		}
		if kind == KindMalloc {
			switch string(k) {
			case attrOwner:
				return bitOwner, true
			case attrInefficient:
				return bitInefficient, true
			case attrShadow:
				return bitShadow, true
			}
		}
	case KindMstx:
		if string(k) == attrMstxID {
			return bitMstxID, true
		}
	case KindAccess:
		switch string(k) {
		case attrAllocID:
			return bitAccessAllocID, false
		case attrSize:
			return bitAccessSize, false
		}
	}
	return 0, false
}

func setTyped[T string | []byte](e *Event, s, k, v T, bit uint16, val func(T) string) error {
	if bit == 0 || applyTyped(e, bit, v, val) {
		return nil
	}
	return attrError(s, fmt.Sprintf("bad %s %q", string(k), string(v)))
}

// applyTyped stores the value of a typed Attr key (bit) in e; false when it
// does not parse. Shared by the reader and the fast path of Open.
func applyTyped[T string | []byte](e *Event, bit uint16, v T, val func(T) string) bool {
	ok := true
	switch bit {
	case bitAllocID, bitAccessAllocID:
		e.AllocID, ok = parseUintDec(v)
	case bitSize, bitAccessSize:
		e.Size, ok = parseUintDec(v)
	case bitMstxID:
		e.MstxID, ok = parseUintDec(v)
	case bitAddr:
		e.Ptr, ok = parseHexPtr(v)
		e.HasPtr = ok
	case bitOwner:
		e.Owner = val(v)
	case bitInefficient:
		e.Inefficient = val(v)
	case bitShadow:
		switch string(v) {
		case "true":
			e.Shadow = true
		case "false":
			e.Shadow = false
		default:
			ok = false
		}
	}
	return ok
}

func required[T string | []byte](e *Event, s T, seen uint16) error {
	var need uint16
	switch e.Kind {
	case KindMalloc, KindFree:
		need = bitAllocID | bitAddr | bitSize
	case KindMstx:
		need = bitMstxID
	}
	if miss := need &^ seen; miss != 0 {
		for _, m := range []struct {
			bit uint16
			key string
		}{{bitAllocID, attrAllocID}, {bitAddr, attrAddr}, {bitSize, attrSize}, {bitMstxID, attrMstxID}} {
			if miss&m.bit != 0 {
				return attrError(s, fmt.Sprintf("%s without %s", e.Kind, m.key))
			}
		}
	}
	return nil
}

// errAttrPrefix is how every Attr error starts.
const errAttrPrefix = "malformed Attr "

func attrError[T string | []byte](s T, what string) error {
	q := string(s)
	if len(q) > 80 {
		q = q[:77] + "..."
	}
	return errors.New(errAttrPrefix + strconv.Quote(q) + ": " + what)
}

// parseUintDec parses a non-empty decimal uint64 without signs.
func parseUintDec[T string | []byte](s T) (uint64, bool) {
	if len(s) == 0 {
		return 0, false
	}
	const max = 1<<64 - 1
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, false
		}
		if i >= 19 && (n > max/10 || n == max/10 && uint64(c) > max%10) {
			return 0, false // overflow: only possible from the 20th digit on
		}
		n = n*10 + uint64(c)
	}
	return n, true
}

// parseHexPtr parses "0x" followed by 1 to 16 hex digits (either case).
func parseHexPtr[T string | []byte](s T) (uint64, bool) {
	if len(s) < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') {
		return 0, false
	}
	s = s[2:]
	for len(s) > 1 && s[0] == '0' {
		s = s[1:]
	}
	if len(s) > 16 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c, ok := hexVal(s[i])
		if !ok {
			return 0, false
		}
		n = n<<4 | uint64(c)
	}
	return n, true
}

// parseIntDec parses a decimal int64 with an optional '-'.
func parseIntDec[T string | []byte](s T) (int64, bool) {
	neg := len(s) > 0 && s[0] == '-'
	if neg {
		s = s[1:]
	}
	u, ok := parseUintDec(s)
	if !ok {
		return 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, false
		}
		return -int64(u), true
	}
	if u > 1<<63-1 {
		return 0, false
	}
	return int64(u), true
}

// hexVal is the value of one hex digit.
func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
