package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// Table is records.def, parsed.
type Table struct {
	Consts, Kinds, Flags []*Item
	Structs              []*Struct
}

// Item is a row of [const], [kind] or [flag].
type Item struct {
	C, Go   string
	Expr    string // the value as written
	Str     string // a "text" value
	IsStr   bool
	Val     uint64
	Comment string
	Doc     []string // the # lines above it
}

// Struct is a [struct C_NAME GoName] section.
type Struct struct {
	C, Go  string
	Doc    []string
	Fields []*Field
	Size   int
}

// Field is a row of a struct.
type Field struct {
	C, Type, Go string
	Comment     string
	Doc         []string
	Off, Size   int
	Signed      bool
}

// Parse reads records.def; an error names its line.
func Parse(src []byte) (*Table, error) {
	t := &Table{}
	vals := map[string]uint64{}
	names := map[string]bool{}
	var section string
	var cur *Struct
	var doc []string
	for i, line := range strings.Split(string(src), "\n") {
		ln := i + 1
		s := strings.TrimSpace(line)
		switch {
		case s == "":
			if section == "" {
				doc = nil // the file's own header stays out of the outputs
			}
			continue
		case strings.HasPrefix(s, "#"):
			doc = append(doc, strings.TrimSpace(strings.TrimPrefix(s, "#")))
			continue
		case strings.HasPrefix(s, "["):
			h := strings.Fields(strings.Trim(s, "[]"))
			switch {
			case len(h) == 1 && (h[0] == "const" || h[0] == "kind" || h[0] == "flag"):
				section, cur = h[0], nil
			case len(h) == 3 && h[0] == "struct":
				section = "struct"
				cur = &Struct{C: h[1], Go: h[2], Doc: doc}
				t.Structs = append(t.Structs, cur)
			default:
				return nil, fmt.Errorf("%d: unknown section %s", ln, s)
			}
			doc = nil
			continue
		}
		if section == "" {
			return nil, fmt.Errorf("%d: a row before any section", ln)
		}
		f, comment, err := columns(s, 3)
		if err != nil {
			return nil, fmt.Errorf("%d: %v", ln, err)
		}
		if section == "struct" {
			if !ident(f[0]) || !ident(f[2]) {
				return nil, fmt.Errorf("%d: bad name", ln)
			}
			fl := &Field{C: f[0], Type: f[1], Go: f[2], Comment: comment, Doc: doc}
			if fl.Size, fl.Signed, err = typeSize(f[1]); err != nil {
				return nil, fmt.Errorf("%d: %v", ln, err)
			}
			cur.Fields = append(cur.Fields, fl)
			doc = nil
			continue
		}
		it := &Item{C: f[0], Go: f[1], Expr: f[2], Comment: comment, Doc: doc}
		doc = nil
		if !ident(it.C) || !ident(it.Go) {
			return nil, fmt.Errorf("%d: bad name", ln)
		}
		if names[it.C] || names["go:"+it.Go] {
			return nil, fmt.Errorf("%d: %s defined twice", ln, it.C)
		}
		names[it.C], names["go:"+it.Go] = true, true
		if strings.HasPrefix(it.Expr, `"`) {
			if it.Str, err = strconv.Unquote(it.Expr); err != nil {
				return nil, fmt.Errorf("%d: %v", ln, err)
			}
			it.IsStr = true
		} else {
			if it.Val, err = eval(it.Expr, vals); err != nil {
				return nil, fmt.Errorf("%d: %v", ln, err)
			}
			vals[it.C] = it.Val
		}
		switch section {
		case "const":
			t.Consts = append(t.Consts, it)
		case "kind":
			if it.IsStr || it.Val == 0 || it.Val >= 0x8000 {
				return nil, fmt.Errorf("%d: a kind is 1 to 0x7fff", ln)
			}
			t.Kinds = append(t.Kinds, it)
		case "flag":
			if it.IsStr || it.Val > 0xffff {
				return nil, fmt.Errorf("%d: a flag fits 16 bits", ln)
			}
			t.Flags = append(t.Flags, it)
		}
	}
	for _, s := range t.Structs {
		off, align := 0, 1
		for _, f := range s.Fields {
			off = (off + f.Size - 1) / f.Size * f.Size
			f.Off = off
			off += f.Size
			align = max(align, f.Size)
		}
		s.Size = (off + align - 1) / align * align
	}
	return t, nil
}

// columns splits s into n whitespace-separated columns and the comment
// after them. A "quoted" column may not hold spaces.
func columns(s string, n int) ([]string, string, error) {
	var f []string
	for len(f) < n {
		s = strings.TrimSpace(s)
		if s == "" {
			return nil, "", fmt.Errorf("want %d columns", n)
		}
		end := strings.IndexFunc(s, unicode.IsSpace)
		if end < 0 {
			end = len(s)
		}
		f = append(f, s[:end])
		s = s[end:]
	}
	return f, strings.TrimSpace(s), nil
}

func ident(s string) bool {
	for i, r := range s {
		if !(r == '_' || unicode.IsLetter(r) || (i > 0 && unicode.IsDigit(r))) {
			return false
		}
	}
	return s != ""
}

func typeSize(t string) (int, bool, error) {
	switch t {
	case "u8", "i8":
		return 1, t[0] == 'i', nil
	case "u16", "i16":
		return 2, t[0] == 'i', nil
	case "u32", "i32":
		return 4, t[0] == 'i', nil
	case "u64", "i64":
		return 8, t[0] == 'i', nil
	}
	return 0, false, fmt.Errorf("unknown type %s", t)
}

// eval computes a value: numbers, names defined above, ( ), <<, +, - and |
// (C's precedence: + - above << above |), in uint64.
func eval(s string, vals map[string]uint64) (uint64, error) {
	p := &exprParser{s: s, vals: vals}
	v := p.or()
	if p.err == nil && p.pos < len(p.s) {
		p.err = fmt.Errorf("unexpected %q in %q", p.s[p.pos:], s)
	}
	return v, p.err
}

type exprParser struct {
	s    string
	pos  int
	vals map[string]uint64
	err  error
}

func (p *exprParser) eat(op string) bool {
	for p.pos < len(p.s) && p.s[p.pos] == ' ' {
		p.pos++
	}
	if strings.HasPrefix(p.s[p.pos:], op) {
		p.pos += len(op)
		return true
	}
	return false
}

func (p *exprParser) or() uint64 {
	v := p.shift()
	for p.err == nil && p.eat("|") {
		v |= p.shift()
	}
	return v
}

func (p *exprParser) shift() uint64 {
	v := p.add()
	for p.err == nil && p.eat("<<") {
		v <<= p.add()
	}
	return v
}

func (p *exprParser) add() uint64 {
	v := p.unary()
	for p.err == nil {
		switch {
		case p.eat("+"):
			v += p.unary()
		case p.eat("-"):
			v -= p.unary()
		default:
			return v
		}
	}
	return v
}

func (p *exprParser) unary() uint64 {
	if p.eat("(") {
		v := p.or()
		if !p.eat(")") {
			p.err = fmt.Errorf("missing ) in %q", p.s)
		}
		return v
	}
	end := p.pos
	for end < len(p.s) && (p.s[end] == '_' || unicode.IsLetter(rune(p.s[end])) || unicode.IsDigit(rune(p.s[end]))) {
		end++
	}
	tok := p.s[p.pos:end]
	p.pos = end
	if tok == "" {
		p.err = fmt.Errorf("missing value in %q", p.s)
		return 0
	}
	if v, ok := p.vals[tok]; ok {
		return v
	}
	v, err := strconv.ParseUint(tok, 0, 64)
	if err != nil {
		p.err = fmt.Errorf("%q is neither a number nor a name above", tok)
	}
	return v
}
