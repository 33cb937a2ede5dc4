package trace

import (
	"bytes"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CSVHeader is the header row of a memscope_dump CSV (SPEC §2.1).
var CSVHeader = []string{"ID", "Event", "Event Type", "Name", "Timestamp(ns)", "Process Id", "Thread Id", "Device Id", "Ptr", "Attr", "Call Stack(Python)", "Call Stack(C)"}

// Column indexes of CSVHeader.
const (
	colID = iota
	colEvent
	colType
	colName
	colTimestamp
	colPid
	colTid
	colDevice
	colPtr
	colAttr
	colPyStack
	colCStack
	numCols
)

// csvBufSize is the size of the writer's buffer and the reader's bufio buffer
// (a variable so that fuzz tests can shrink it to exercise the long-row paths).
var csvBufSize = 1 << 20

// CSVWriter writes events as memscope_dump CSV rows. Its output is byte for
// byte what encoding/csv would write for the same fields (RFC 4180, "\n" line
// ends), but rows are formatted with append straight into one reusable 1 MiB
// buffer that is handed to the underlying writer when nearly full (it is the
// write buffer, so nothing is copied twice), and writing does not allocate.
// Errors are sticky: after the first one every call returns it.
type CSVWriter struct {
	w      io.Writer
	buf    []byte // pending output
	scr    []byte // scratch for an Attr that needs escaping
	rows   uint64
	header bool
	err    error

	id, stamp decRun          // the ID and Timestamp columns
	allocIDs  decRun          // the Attr's allocation_id
	ptrs      [16]hexRun      // the Ptr column, by thread slot (each thread its arena)
	heads     [16]rowHead     // by Kind (rows alternate MALLOC and FREE)
	whos      [16]rowWho      // by thread id
	plain     [numCols]string // per column, the last value seen that needs no quotes
	par       *csvBatches     // WriteBatch's goroutines, while it is in use
}

// rowHead and rowWho are runs of columns that rows repeat, formatted
// once: ",Event,Event Type,Name," and ",Process Id,Thread Id,Device Id,"
// (small caches: one a kind, one a thread slot).
type rowHead struct {
	kind      Kind
	typ, name string
	text      []byte
}

type rowWho struct {
	pid, tid int64
	dev      string
	text     []byte
}

// NewCSVWriter returns a writer to w. The header is written with the first row,
// or by Flush when there are no rows.
func NewCSVWriter(w io.Writer) *CSVWriter {
	return &CSVWriter{w: w, buf: make([]byte, 0, csvBufSize)}
}

func (w *CSVWriter) writeHeader() {
	w.header = true
	for i, h := range CSVHeader {
		if i > 0 {
			w.buf = append(w.buf, ',')
		}
		w.buf = appendCSVField(w.buf, h)
	}
	w.buf = append(w.buf, '\n')
}

// Write writes one row for e; the ID column is e.ID.
func (w *CSVWriter) Write(e *Event) error {
	if w.err != nil {
		return w.err
	}
	if !w.header {
		w.writeHeader()
	}
	w.buf = w.appendRow(w.buf, e)
	w.rows++
	if len(w.buf) >= csvBufSize-csvBufSize/16 { // nearly full: write it out
		return w.flushBuf()
	}
	return nil
}

// appendRow appends e's row to b.
func (w *CSVWriter) appendRow(b []byte, e *Event) []byte {
	b = w.id.append(b, e.ID)
	h := &w.heads[e.Kind&15]
	if h.text == nil || h.kind != e.Kind || h.typ != e.Type || h.name != e.Name {
		t := append(h.text[:0], ',')
		t = append(t, e.Kind.String()...) // kind names never need quotes
		t = append(t, ',')
		t = w.field(t, colType, e.Type, "") // an empty type stays empty
		t = append(t, ',')
		t = w.field(t, colName, e.Name, NA)
		h.kind, h.typ, h.name, h.text = e.Kind, e.Type, e.Name, append(t, ',')
	}
	b = append(b, h.text...)
	b = w.stamp.append(b, e.Timestamp)
	who := &w.whos[e.Tid&15]
	if who.text == nil || who.pid != e.Pid || who.tid != e.Tid || who.dev != e.Device {
		t := append(who.text[:0], ',')
		t = appendInt(t, e.Pid)
		t = append(t, ',')
		t = appendInt(t, e.Tid)
		t = append(t, ',')
		t = w.field(t, colDevice, e.Device, NA)
		who.pid, who.tid, who.dev, who.text = e.Pid, e.Tid, e.Device, append(t, ',')
	}
	b = append(b, who.text...)
	var hex []byte // the Ptr column's digits, which the Attr repeats
	if e.HasPtr {
		b = append(b, "0x"...)
		h := len(b)
		b = w.ptrs[e.Tid&15].append(b, e.Ptr)
		hex = b[h:]
	} else {
		b = append(b, NA...)
	}
	b = append(b, ',')
	b = w.appendAttr(b, e, hex)
	b = append(b, ',')
	b = w.field(b, colPyStack, e.PyStack, NA)
	b = append(b, ',')
	b = w.field(b, colCStack, e.CStack, NA)
	return append(b, '\n')
}

// appendAttr appends the Attr field, formatted in place after a tentative
// opening quote. An Attr starts with '{', so only its bytes decide quoting.
func (w *CSVWriter) appendAttr(b []byte, e *Event, ptrHex []byte) []byte {
	start := len(b)
	b = append(b, '"')
	b = e.appendAttr(b, ptrHex, &w.allocIDs)
	if e.IsMemory() && len(e.Extra) == 0 && strings.IndexByte(e.Owner, '"') < 0 && strings.IndexByte(e.Inefficient, '"') < 0 {
		// Most rows: a MALLOC's or FREE's Attr has commas and no '"' in
		// its numbers, so it is quoted as it is, without a look.
		return append(b, '"')
	}
	f := b[start+1:]
	switch quote := csvQuoteIndex(f); {
	case quote < 0:
		return b[:start+copy(b[start:], f)] // no quotes needed: drop the tentative one
	case quote == len(f):
		return append(b, '"')
	}
	w.scr = append(w.scr[:0], f...)
	return appendCSVField(b[:start], w.scr)
}

// csvQuoteIndex is -1 if field f needs no quotes, len(f) if it needs quotes
// but holds no '"', and the index of the first '"' otherwise. (It ignores the
// leading-space and \. rules, which cannot apply to an Attr.)
func csvQuoteIndex(f []byte) int {
	// One vectorized look per byte value: an Attr is scanned on every row.
	if i := bytes.IndexByte(f, '"'); i >= 0 {
		return i
	}
	if bytes.IndexByte(f, ',') >= 0 || bytes.IndexByte(f, '\n') >= 0 || bytes.IndexByte(f, '\r') >= 0 {
		return len(f)
	}
	return -1
}

func (w *CSVWriter) flushBuf() error {
	if len(w.buf) > 0 {
		_, w.err = w.w.Write(w.buf)
		w.buf = w.buf[:0]
		if cap(w.buf) > 4*csvBufSize { // a huge row grew it: shrink back
			w.buf = make([]byte, 0, csvBufSize)
		}
	}
	return w.err
}

// Flush writes the header if no row was written yet, then everything pending
// to the underlying writer.
func (w *CSVWriter) Flush() error {
	if err := w.endBatches(false); err != nil {
		return err
	}
	if w.err != nil {
		return w.err
	}
	if !w.header {
		w.writeHeader()
	}
	return w.flushBuf()
}

// Rows returns the number of rows written (the header not counted).
func (w *CSVWriter) Rows() uint64 { return w.rows }

// field appends column col's field s (empty: empty, written as it is: N/A
// or ""), skipping the look for characters to quote when s is the column's
// last value that had none (rows repeat their types, devices and stacks).
func (w *CSVWriter) field(b []byte, col int, s, empty string) []byte {
	switch {
	case s == "":
		return append(b, empty...)
	case s == w.plain[col]:
		return append(b, s...)
	case !csvNeedsQuotes(s):
		w.plain[col] = s
		return append(b, s...)
	}
	return appendCSVField(b, s)
}

// appendCSVField appends one field, quoted exactly when encoding/csv's Writer
// (Comma ',', UseCRLF false) would quote it.
func appendCSVField[T string | []byte](b []byte, s T) []byte {
	if !csvNeedsQuotes(s) {
		return append(b, s...)
	}
	b = append(b, '"')
	for {
		i := 0
		for i < len(s) && s[i] != '"' {
			i++
		}
		b = append(b, s[:i]...)
		if i == len(s) {
			break
		}
		b = append(b, '"', '"')
		s = s[i+1:]
	}
	return append(b, '"')
}

// csvSpecial marks the bytes that make encoding/csv quote a field.
var csvSpecial = [256]bool{',': true, '"': true, '\n': true, '\r': true}

// csvNeedsQuotes mirrors encoding/csv's fieldNeedsQuotes.
func csvNeedsQuotes[T string | []byte](s T) bool {
	if len(s) == 0 {
		return false
	}
	if len(s) == 2 && s[0] == '\\' && s[1] == '.' {
		return true
	}
	for i := 0; i < len(s); i++ {
		if csvSpecial[s[i]] {
			return true
		}
	}
	c := s[0]
	if c < utf8.RuneSelf {
		return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
	}
	var r rune
	switch v := any(s).(type) {
	case string:
		r, _ = utf8.DecodeRuneInString(v)
	case []byte:
		r, _ = utf8.DecodeRune(v)
	}
	return unicode.IsSpace(r)
}
