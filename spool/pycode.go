package spool

import (
	"encoding/binary"
	"strconv"
	"strings"

	"msmemscope/format"
)

// Python stacks in the spool (libmemscope/pystack.h): a MALLOC record with
// FPyStack has the payload {n_c | n_py<<32}, n_c return addresses, n_py
// frames {code id | instruction<<32}; each code id is described once by an
// RPyCode record. Code records, the package folders whose frames are
// msmemscope's own (RPySkip) and the latest configuration (RConfig) are
// collected while the spool is indexed, so frames can be named in any order.

// pyCodeHdrSz is the size of an R_PYCODE payload's fixed head (ms_pycode).
const pyCodeHdrSz = format.PyCodeSize

// PyCode is a Python code object as the hook copied it.
type PyCode struct {
	ID             uint32
	FirstLine      int
	FirstTraceable int
	File           string
	Name           string
	QualName       string
	LineTable      []byte // co_linetable, in LineTableFormat
	// LineTableFormat is format.PyLTLocations (CPython 3.11 on; the zero
	// value, as spools written before the field existed say) or
	// format.PyLTPEP626 (3.10).
	LineTableFormat uint16
}

// PyFrame is one frame of a Python stack: a code id and the frame's
// instruction index in code units (-1: not started).
type PyFrame struct {
	Code  uint32
	Lasti int32
}

// PyMeta is what a spool says about Python.
type PyMeta struct {
	Codes    map[uint32]*PyCode
	Skip     []string // folders of msmemscope's own Python package
	Config   string   // the latest configuration given through the Python API (JSON), or ""
	configTS uint64
}

// ParsePyCode decodes an RPyCode payload.
func ParsePyCode(p []byte) (*PyCode, bool) {
	if len(p) < pyCodeHdrSz {
		return nil, false
	}
	c := &PyCode{
		ID:              binary.LittleEndian.Uint32(p[format.PyCodeIDOff:]),
		FirstLine:       int(int32(binary.LittleEndian.Uint32(p[format.PyCodeFirstLineOff:]))),
		FirstTraceable:  int(int32(binary.LittleEndian.Uint32(p[format.PyCodeFirstTraceableOff:]))),
		LineTableFormat: binary.LittleEndian.Uint16(p[format.PyCodeLineTableFormatOff:]),
	}
	fl := int(binary.LittleEndian.Uint16(p[format.PyCodeFileLenOff:]))
	nl := int(binary.LittleEndian.Uint16(p[format.PyCodeNameLenOff:]))
	ql := int(binary.LittleEndian.Uint16(p[format.PyCodeQualNameLenOff:]))
	ll := int(binary.LittleEndian.Uint32(p[format.PyCodeLineTableLenOff:]))
	rest := p[pyCodeHdrSz:]
	take := func(n int) string {
		if n > len(rest) {
			n = len(rest)
		}
		s := strings.ToValidUTF8(string(rest[:n]), "?")
		rest = rest[n:]
		return s
	}
	c.File, c.Name, c.QualName = take(fl), take(nl), take(ql)
	if ll > len(rest) {
		ll = len(rest) // cut short (written after the final drain): lines past it fall back
	}
	c.LineTable = append([]byte(nil), rest[:ll]...)
	return c, true
}

// notePython is called by the spool index for each record of a Python kind;
// rec is the record with its continuation records.
func (m *PyMeta) note(kind uint16, ts uint64, a, b uint64, payload []byte) {
	switch kind {
	case format.RPyCode:
		if c, ok := ParsePyCode(payload); ok {
			if m.Codes == nil {
				m.Codes = map[uint32]*PyCode{}
			}
			m.Codes[c.ID] = c
		}
	case format.RPySkip:
		if s := string(payload[:textLen(b, payload)]); s != "" {
			for _, x := range m.Skip {
				if x == s {
					return
				}
			}
			m.Skip = append(m.Skip, s)
		}
	case format.RConfig:
		if m.Config == "" || ts >= m.configTS {
			m.Config, m.configTS = string(payload[:textLen(b, payload)]), ts
		}
	}
}

// Stacks splits a MALLOC payload into its C return addresses and Python
// frames.
func (r *Rec) Stacks() (c []uint64, py []PyFrame) {
	if r.Flags&format.FPyStack == 0 {
		if r.Flags&format.FCStack != 0 {
			return r.Frames(), nil
		}
		return nil, nil
	}
	p := r.Payload
	if len(p) < 8 {
		return nil, nil
	}
	nc := int(binary.LittleEndian.Uint32(p[0:]))
	np := int(binary.LittleEndian.Uint32(p[4:]))
	p = p[8:]
	if nc > len(p)/8 {
		return nil, nil
	}
	c = make([]uint64, nc)
	for i := range c {
		c[i] = binary.LittleEndian.Uint64(p[i*8:])
	}
	p = p[nc*8:]
	if np > len(p)/8 {
		np = len(p) / 8
	}
	py = make([]PyFrame, np)
	for i := range py {
		py[i] = PyFrame{Code: binary.LittleEndian.Uint32(p[i*8:]), Lasti: int32(binary.LittleEndian.Uint32(p[i*8+4:]))}
	}
	return c, py
}

// Line returns the source line of the instruction at index lasti (code
// units), as the interpreter's PyCode_Addr2Line does, or -1 where the table
// says the instruction has no line. Frames not yet started (lasti < 0) are
// on the first line.
func (c *PyCode) Line(lasti int) int {
	if lasti < 0 {
		return c.FirstLine
	}
	addr := lasti * 2
	if c.LineTableFormat == format.PyLTPEP626 {
		line := -1
		c.pep626(func(start, end, l int) bool {
			if end > addr {
				line = l
				return false
			}
			return true
		})
		return line
	}
	lt := c.LineTable
	line, end := c.FirstLine, 0
	for p := 0; p < len(lt); {
		b := lt[p]
		code := (b >> 3) & 15
		delta := 0
		switch code {
		case 13, 14: // no columns; long form: a signed varint line delta
			delta, _ = signedVarint(lt[p+1:])
		case 11:
			delta = 1
		case 12:
			delta = 2
		}
		line += delta
		end += int(b&7+1) * 2
		for p++; p < len(lt) && lt[p]&0x80 == 0; p++ {
		}
		if end > addr {
			if code == 15 {
				return -1
			}
			return line
		}
	}
	return -1
}

// Lines returns the line table as the interpreter's co_lines() does: one
// (start, end, line) range in bytes per table entry, -1 for no line.
func (c *PyCode) Lines() [][3]int {
	var out [][3]int
	if c.LineTableFormat == format.PyLTPEP626 {
		c.pep626(func(start, end, l int) bool {
			out = append(out, [3]int{start, end, l})
			return true
		})
		return out
	}
	lt := c.LineTable
	line, end := c.FirstLine, 0
	for p := 0; p < len(lt); {
		b := lt[p]
		code := (b >> 3) & 15
		switch code {
		case 13, 14:
			d, _ := signedVarint(lt[p+1:])
			line += d
		case 11:
			line++
		case 12:
			line += 2
		}
		l := line
		if code == 15 {
			l = -1
		}
		start := end
		end += int(b&7+1) * 2
		out = append(out, [3]int{start, end, l})
		for p++; p < len(lt) && lt[p]&0x80 == 0; p++ {
		}
	}
	return out
}

// pep626 walks a CPython 3.10 line table (Objects/lnotab_notes.txt there):
// pairs of an unsigned byte offset delta and a signed line delta, -128 for
// no line. Like 3.10's _PyLineTable_NextAddressRange it gives each
// non-empty range in order; an empty entry's line delta still counts.
func (c *PyCode) pep626(yield func(start, end, line int) bool) {
	lt := c.LineTable
	line, end := c.FirstLine, 0
	for p := 0; p+1 < len(lt); p += 2 {
		start := end
		end += int(lt[p])
		l := -1
		if d := int8(lt[p+1]); d != -128 {
			line += int(d)
			l = line
		}
		if end != start && !yield(start, end, l) {
			return
		}
	}
}

func varint(p []byte) (int, int) {
	if len(p) == 0 {
		return 0, 0
	}
	read := p[0]
	val := int(read & 63)
	shift, i := 0, 1
	for read&64 != 0 && i < len(p) && shift < 56 {
		read = p[i]
		i++
		shift += 6
		val |= int(read&63) << shift
	}
	return val, i
}

func signedVarint(p []byte) (int, int) {
	u, n := varint(p)
	if u&1 != 0 {
		return -(u >> 1), n
	}
	return u >> 1, n
}

// FormatPyStack writes frames as SPEC §2.1's Python call stack:
// "file:line(function)" innermost first, ';'-separated, frames of
// msmemscope's own package left out; "" when no frame remains. line caches
// line numbers per (code, instruction) across calls.
func (m *PyMeta) FormatPyStack(frames []PyFrame, line map[PyFrame]int) string {
	var b strings.Builder
	n := 0
	for _, f := range frames {
		c := m.Codes[f.Code]
		if c == nil {
			continue
		}
		if m.skip(c.File) {
			continue
		}
		l, ok := line[f]
		if !ok {
			l = c.Line(int(f.Lasti))
			if l < 0 {
				l = c.FirstLine
			}
			line[f] = l
		}
		if n > 0 {
			b.WriteByte(';')
		}
		n++
		b.WriteString(strings.ReplaceAll(c.File, ";", ","))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(l))
		b.WriteByte('(')
		b.WriteString(strings.ReplaceAll(c.Name, ";", ","))
		b.WriteByte(')')
	}
	return b.String()
}

func (m *PyMeta) skip(file string) bool {
	for _, s := range m.Skip {
		if strings.HasPrefix(file, s) {
			return true
		}
	}
	return false
}
