package trace

import (
	"bufio"
	"bytes"
	"fmt"
)

// The fast path of the CSV input (csvinput.go): one parser per worker cuts
// each record's fields in place and hands anything unusual to csvReader.

// chunkParser parses chunks of records; one per worker.
type chunkParser struct {
	name   string
	lean   bool
	intern interner
	last   [numCols]string
	fb     *csvReader // the slow path
	rd     bytes.Reader
	acc    []byte
	f      [numCols][]byte
	recent [numCols][8]string
	kinds  kindMask
	skip   bool        // lead met a row of a kind not in kinds
	index  bool        // record where MALLOC rows start
	offs   []RowOffset // ... here
	rows   int         // records parsed (or skipped for their kind)
}

func newChunkParser(name string, lean bool) *chunkParser {
	p := &chunkParser{name: name, lean: lean, intern: interner{m: make(map[string]string, 256)}}
	p.fb = &csvReader{
		br:     bufio.NewReaderSize(&p.rd, 64<<10),
		name:   name,
		rec:    make([]byte, 0, 4096),
		ends:   make([]int, 0, numCols+1),
		intern: p.intern,
	}
	return p
}

// parse parses the records of data, whose first line is line number line.
// It returns the events before the first bad record and its error.
func (p *chunkParser) parse(evs []Event, data []byte, line int, off int64) ([]Event, error) {
	if n := bytes.Count(data, []byte{'\n'}) + 1; cap(evs) < n {
		evs = make([]Event, 0, n)
	}
	end := off + int64(len(data)) // the offset where data ends
	for len(data) > 0 {
		at := end - int64(len(data)) // where this record starts
		i := bytes.IndexByte(data, '\n')
		var ln []byte
		if i < 0 {
			ln, data = data, nil
		} else {
			ln, data = data[:i+1], data[i+1:]
		}
		start := line
		line++
		if eolLen(ln) == len(ln) {
			continue // an empty line
		}
		p.rows++
		q := bytes.Count(ln, quoteByte)
		raw := ln
		if ln[len(ln)-1] != '\n' {
			// The file's last line, without its line end: the writer ends
			// every row with one, so the file was cut (the slow path says so).
		} else if q&1 == 1 { // a record over several lines: the slow path
			p.acc = append(p.acc[:0], ln...)
			for len(data) > 0 && q&1 == 1 {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					ln, data = data, nil
				} else {
					ln, data = data[:i+1], data[i+1:]
				}
				line++
				q += bytes.Count(ln, quoteByte)
				p.acc = append(p.acc, ln...)
			}
			raw = p.acc
		} else {
			evs = append(evs, Event{})
			if e := &evs[len(evs)-1]; p.fast(e, ln, q) {
				if p.index && e.Kind == KindMalloc {
					p.offs = append(p.offs, RowOffset{e.ID, at})
				}
				continue
			}
			evs = evs[:len(evs)-1]
			if p.skip { // a kind not wanted
				p.skip = false
				continue
			}
		}
		e, err := p.slow(raw, start)
		if err != nil {
			return evs, err
		}
		if p.kinds.has(e.Kind) {
			evs = append(evs, *e)
			if p.index && e.Kind == KindMalloc {
				p.offs = append(p.offs, RowOffset{e.ID, at})
			}
		}
	}
	return evs, nil
}

// one parses one raw record, whose first line is number line.
func (p *chunkParser) one(raw []byte, line int) (*Event, error) {
	if q, nl := bytes.Count(raw, quoteByte), bytes.IndexByte(raw, '\n'); q&1 == 0 && nl >= 0 && nl == len(raw)-1 {
		e := new(Event)
		if p.fast(e, raw, q) {
			return e, nil
		}
		p.skip = false
	}
	return p.slow(raw, line)
}

// slow parses one raw record with csvReader.
func (p *chunkParser) slow(raw []byte, line int) (*Event, error) {
	p.rd.Reset(raw)
	p.fb.br.Reset(&p.rd)
	p.fb.line, p.fb.err, p.fb.long = line-1, nil, nil
	e, err := p.fb.Next()
	if err == nil && e == nil {
		err = fmt.Errorf("%s:%d: empty record", p.name, line)
	}
	if err != nil {
		return nil, err
	}
	if p.lean {
		e.Extra, e.PyStack, e.CStack = nil, "", ""
	}
	return e, nil
}

// fast parses a one-line record with quotes quote characters into e, or
// reports false when it needs the slow path.
func (p *chunkParser) fast(e *Event, ln []byte, quotes int) bool {
	ln = ln[:len(ln)-eolLen(ln)]
	// The leading fields parse as they are found; a row with one quoted
	// (a rare Name) takes the slow path.
	pos, ok := p.lead(e, ln)
	return ok && p.tail(ln, pos, quotes) && p.fillTail(e)
}

// tail splits Attr and the stacks, which start at ln[pos:], into p.f; the
// fields before them hold none of the line's quotes quote characters.
func (p *chunkParser) tail(ln []byte, pos, quotes int) bool {
	f := &p.f
	quoted := 0
	for i := colAttr; i < numCols; i++ {
		if pos < len(ln) && ln[pos] == '"' {
			j := bytes.IndexByte(ln[pos+1:], '"')
			if j < 0 {
				return false
			}
			f[i] = ln[pos+1 : pos+1+j]
			pos += j + 2
			quoted++
		} else {
			j := bytes.IndexByte(ln[pos:], ',')
			if j < 0 {
				j = len(ln) - pos
			}
			f[i] = ln[pos : pos+j]
			pos += j
		}
		if i == numCols-1 {
			if pos != len(ln) {
				return false
			}
			break
		}
		if pos >= len(ln) || ln[pos] != ',' {
			return false
		}
		pos++
	}
	return quotes == 2*quoted // else a quote inside a field
}

// lead parses the fields before Attr, none of them quoted, in the same pass
// that finds them (fill's rules), and returns where Attr starts.
func (p *chunkParser) lead(e *Event, ln []byte) (pos int, ok bool) {
	var b []byte
	if e.ID, pos, ok = leadUint(ln, 0); !ok {
		return 0, false
	}
	// The common values are recognized whole, their ',' included.
	switch {
	case leadIs(ln, pos, "MALLOC,"):
		e.Kind, pos = KindMalloc, pos+7
	case leadIs(ln, pos, "FREE,"):
		e.Kind, pos = KindFree, pos+5
	case leadIs(ln, pos, "ACCESS,"):
		e.Kind, pos = KindAccess, pos+7
	case leadIs(ln, pos, "OP_LAUNCH,"):
		e.Kind, pos = KindOpLaunch, pos+10
	default:
		if b, pos = leadField(ln, pos); pos < 0 {
			return 0, false
		}
		if e.Kind = fastKind(b); e.Kind == 0 {
			return 0, false
		}
	}
	if !p.kinds.has(e.Kind) {
		p.skip = true
		return 0, false
	}
	if b, pos = leadField(ln, pos); pos < 0 {
		return 0, false
	}
	e.Type = p.str(colType, b, false)
	if leadIs(ln, pos, NA+",") {
		e.Name, pos = "", pos+len(NA)+1
	} else {
		if b, pos = leadField(ln, pos); pos < 0 {
			return 0, false
		}
		e.Name = p.str(colName, b, true)
	}
	if e.Timestamp, pos, ok = leadUint(ln, pos); !ok {
		return 0, false
	}
	if e.Pid, pos, ok = leadInt(ln, pos); !ok {
		return 0, false
	}
	if e.Tid, pos, ok = leadInt(ln, pos); !ok {
		return 0, false
	}
	if b, pos = leadField(ln, pos); pos < 0 {
		return 0, false
	}
	e.Device = p.str(colDevice, b, true)
	if leadIs(ln, pos, NA+",") {
		e.Ptr, e.HasPtr = 0, false
		return pos + len(NA) + 1, true
	}
	// An address is parsed in the pass that finds its end.
	if n, j, ok := scanNumber(ln, pos, true); ok && j < len(ln) && ln[j] == ',' {
		e.Ptr, e.HasPtr = n, true
		return j + 1, true
	}
	if b, pos = leadField(ln, pos); pos < 0 {
		return 0, false
	}
	return pos, parsePtr(e, b)
}

// leadIs reports whether ln[pos:] starts with tok.
func leadIs(ln []byte, pos int, tok string) bool {
	return len(ln)-pos >= len(tok) && string(ln[pos:pos+len(tok)]) == tok
}

// parsePtr parses the Ptr column into e: "N/A" or a hex address.
func parsePtr(e *Event, b []byte) bool {
	e.Ptr, e.HasPtr = 0, false
	if string(b) == NA {
		return true
	}
	var ok bool
	e.Ptr, ok = parseHexPtr(b)
	e.HasPtr = ok
	return ok
}

// leadField returns the plain field at ln[pos:] and the position past its
// ',', or -1 when it is quoted or the last one.
func leadField(ln []byte, pos int) ([]byte, int) {
	j := pos
	for j < len(ln) && ln[j] != ',' {
		j++
	}
	if j == len(ln) || (j > pos && ln[pos] == '"') {
		return nil, -1
	}
	return ln[pos:j], j + 1
}

// leadUint parses the unsigned decimal field at ln[pos:] of at most 19
// digits (no overflow is possible) and returns the position past its ','.
func leadUint(ln []byte, pos int) (uint64, int, bool) {
	var n uint64
	i := pos
	for ; i < len(ln); i++ {
		c := ln[i] - '0'
		if c > 9 {
			break
		}
		n = n*10 + uint64(c)
	}
	if i == pos || i-pos > 19 || i == len(ln) || ln[i] != ',' {
		return 0, 0, false
	}
	return n, i + 1, true
}

// leadInt is leadUint with an optional '-', within int64.
func leadInt(ln []byte, pos int) (int64, int, bool) {
	neg := pos < len(ln) && ln[pos] == '-'
	if neg {
		pos++
	}
	u, next, ok := leadUint(ln, pos)
	if !ok || u > 1<<63-1 {
		return 0, 0, false
	}
	if neg {
		return -int64(u), next, true
	}
	return int64(u), next, true
}

// fill parses the fields in p.f into e (SQLite rows), or reports false
// when the slow path must say what is wrong.
func (p *chunkParser) fill(e *Event) bool {
	f := &p.f
	var ok bool
	if e.ID, ok = parseUintDec(f[colID]); !ok {
		return false
	}
	if e.Kind = fastKind(f[colEvent]); e.Kind == 0 {
		return false
	}
	e.Type = p.str(colType, f[colType], false)
	e.Name = p.str(colName, f[colName], true)
	if e.Timestamp, ok = parseUintDec(f[colTimestamp]); !ok {
		return false
	}
	if e.Pid, ok = parseIntDec(f[colPid]); !ok {
		return false
	}
	if e.Tid, ok = parseIntDec(f[colTid]); !ok {
		return false
	}
	e.Device = p.str(colDevice, f[colDevice], true)
	return parsePtr(e, f[colPtr]) && p.fillTail(e)
}

// fillTail parses Attr and the stacks in p.f into e, whose Ptr is parsed.
func (p *chunkParser) fillTail(e *Event) bool {
	f := &p.f
	ptr, hasPtr := e.Ptr, e.HasPtr
	if p.lean {
		if !leanAttr(e, f[colAttr], p.intern.get) {
			return false
		}
	} else if parseAttr(e, f[colAttr], p.intern.get, bytesString) != nil {
		return false
	}
	if e.IsMemory() && (!hasPtr || ptr != e.Ptr) {
		return false
	}
	if !p.lean {
		e.PyStack = p.str(colPyStack, f[colPyStack], true)
		e.CStack = p.str(colCStack, f[colCStack], true)
	}
	return true
}

// str is csvReader.str over the fast path's fields, with a few recent
// values of each column kept to spare map lookups.
func (p *chunkParser) str(col int, b []byte, na bool) string {
	if string(b) == p.last[col] {
		return p.last[col]
	}
	if na && string(b) == NA {
		return ""
	}
	r := &p.recent[col]
	for _, s := range r {
		if s == string(b) && s != "" {
			p.last[col] = s
			return s
		}
	}
	s := p.intern.get(b)
	copy(r[1:], r[:])
	r[0] = s
	p.last[col] = s
	return s
}

// fastKind is kindOf for the common kinds.
func fastKind(b []byte) Kind {
	switch string(b) {
	case "MALLOC":
		return KindMalloc
	case "FREE":
		return KindFree
	case "ACCESS":
		return KindAccess
	case "OP_LAUNCH":
		return KindOpLaunch
	}
	return kindOf(b)
}

// attrValueStop marks the bytes that end (',') or spoil ('{', '}') a value.
var attrValueStop = [256]uint8{',': 1, '{': 1, '}': 1}

// attrKeyLen returns the length of the key at the start of b when it is one
// that msmemscope writes followed by ':' (found without a loop over its
// bytes), else 0.
func attrKeyLen[T string | []byte](b T) int {
	switch {
	case len(b) < 4:
	case b[0] == 'a' && b[1] == 'l':
		return keyIs(b, "allocation_id:")
	case b[0] == 'a':
		return keyIs(b, "addr:")
	case b[0] == 's' && b[1] == 'i':
		return keyIs(b, "size:")
	case b[0] == 's' && b[2] == 'a' && b[3] == 'p':
		return keyIs(b, "shape:")
	case b[0] == 's':
		return keyIs(b, "shadow:")
	case b[0] == 'o':
		return keyIs(b, "owner:")
	case b[0] == 't' && b[1] == 'y':
		return keyIs(b, "type:")
	case b[0] == 't':
		return keyIs(b, "total:")
	case b[0] == 'u':
		return keyIs(b, "used:")
	case b[0] == 'd':
		return keyIs(b, "dtype:")
	case b[0] == 'f':
		return keyIs(b, "format:")
	case b[0] == 'i' && b[1] == 'd':
		return keyIs(b, "id:")
	case b[0] == 'i':
		return keyIs(b, "inefficient:")
	}
	return 0
}

// keyIs returns len(k)-1 when b starts with k, else 0.
func keyIs[T string | []byte](b T, k string) int {
	if len(b) >= len(k) && string(b[:len(k)]) == k {
		return len(k) - 1
	}
	return 0
}

// leanAttr parses the typed pairs of an Attr column as parseAttr does and
// skips the others; it reports false for anything parseAttr might refuse
// (the slow path then says why).
func leanAttr[T string | []byte](e *Event, s T, intern func(T) string) bool {
	e.AllocID, e.Size, e.Owner, e.Inefficient, e.Shadow, e.MstxID = 0, 0, "", "", false, 0
	e.Extra = nil
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return false
	}
	body := s[1 : len(s)-1]
	var seen uint16
	for i := 0; i < len(body); {
		ks := i
		if n := attrKeyLen(body[i:]); n > 0 {
			i += n
		} else {
			for i < len(body) && attrSpecial[body[i]] == 0 {
				i++
			}
			if i == len(body) || body[i] != ':' || i == ks {
				return false // no ':', an empty key, or '{', '}', ',' in a key
			}
		}
		k := body[ks:i]
		i++
		bit, typed := typedKey(e.Kind, k)
		// A number is parsed in the pass that finds its end (as parseAttr
		// does); anything unusual goes the general way below.
		if bit&bitsNumeric != 0 && (!typed || seen&bit == 0) {
			if n, j, ok := scanNumber(body, i, bit == bitAddr); ok && (j == len(body) || body[j] == ',') {
				setNumeric(e, bit, n)
				if typed {
					seen |= bit
				}
				if i = j; i < len(body) { // past the ','; a trailing ',' leaves an empty pair
					if i++; i == len(body) {
						return false
					}
				}
				continue
			}
		}
		vs := i
		for i < len(body) && attrValueStop[body[i]] == 0 {
			i++
		}
		if i < len(body) && body[i] != ',' {
			return false // '{' or '}' in a value
		}
		v := body[vs:i]
		if i < len(body) { // past the ','; a trailing ',' leaves an empty pair
			i++
			if i == len(body) {
				return false
			}
		}
		if bit == 0 {
			continue
		}
		if typed {
			if seen&bit != 0 {
				return false
			}
			seen |= bit
		}
		if !applyTyped(e, bit, v, intern) {
			return false
		}
	}
	switch e.Kind {
	case KindMalloc, KindFree:
		return seen&(bitAllocID|bitAddr|bitSize) == bitAllocID|bitAddr|bitSize
	case KindMstx:
		return seen&bitMstxID != 0
	}
	return true
}
