package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// csvReader reads a memscope_dump CSV (SPEC §2.1) as a Stream of events,
// one record at a time. It is the one definition of how a dump CSV reads:
// Open's parallel input (csvinput.go) checks the header with it, takes a
// fast path through plain records and hands every other record to it, so
// the events and the errors are the same either way. Outside this package
// a CSV is read with Open.
//
// It streams: memory use is bounded by the longest record plus a bounded table
// of interned strings (event types, names, devices, owners, call stacks), not by
// the file's size. Records are parsed by hand (RFC 4180: quoted fields, ""
// escapes, fields spanning lines, "\n" or "\r\n" line ends; empty lines are
// skipped) into one reused buffer, and the strings that repeat
// are shared, so a row costs one allocation (the Event) plus its Extra pairs.
//
// Every error is one line, "<name>:<line>: <what>", with the line where the
// offending record starts, and is sticky. Step is not filled in: wrap the
// reader with WithSteps for that.
type csvReader struct {
	br        *bufio.Reader
	name      string
	line      int    // lines read so far
	long      []byte // a line longer than br's buffer
	rec       []byte // the unescaped fields of the current record
	ends      []int  // end offset of each field in rec
	noNewline bool   // the last line read ended at EOF without '\n'
	intern    interner
	last      [numCols]string // the previous row's string of each column
	err       error
}

// maxLineBytes bounds one record (a corrupt file without newlines must not
// exhaust memory).
const maxLineBytes = 256 << 20

// newCSVReader reads the header row of r and checks it against CSVHeader; name
// is used in errors (usually the file's path). A missing, renamed or extra
// column is an error naming it.
func newCSVReader(r io.Reader, name string) (*csvReader, error) {
	cr := &csvReader{
		br:     bufio.NewReaderSize(r, csvBufSize),
		name:   name,
		rec:    make([]byte, 0, 4096),
		ends:   make([]int, 0, numCols+1),
		intern: interner{m: make(map[string]string, 256)},
	}
	if head, _ := cr.br.Peek(512); binaryHeader(head) {
		// (a damaged spool or log, or another program's file: its bytes
		// read as a header's columns or quotes say nothing)
		return nil, fmt.Errorf("%s: not a dump CSV or DB, a spool or a rotated log: its first bytes are binary", name)
	}
	start, err := cr.readRecord()
	if err == io.EOF {
		return nil, fmt.Errorf("%s:1: empty file: no header row", name)
	}
	if err != nil {
		return nil, cr.errorf(start, "%s", err)
	}
	got := make([]string, len(cr.ends))
	for i := range got {
		got[i] = strings.TrimSpace(string(cr.field(i)))
	}
	if len(got) > 0 {
		got[0] = strings.TrimSpace(strings.TrimPrefix(got[0], "\uFEFF"))
	}
	if err := checkHeader(got); err != nil {
		if cr.noNewline && headerPrefix(got) {
			return nil, cr.errorf(start, "header: it ends after %q%s", got[len(got)-1], CutShort)
		}
		return nil, cr.errorf(start, "header: %s", err)
	}
	if cr.noNewline {
		return nil, cr.errorf(start, "header: no line end after it%s", CutShort)
	}
	return cr, nil
}

// binaryHeader reports whether a file's first bytes, up to its first line
// end, hold bytes no text file has (a NUL, control bytes other than white
// space, bytes that are not UTF-8: a character cut at the end aside).
func binaryHeader(b []byte) bool {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 && utf8.FullRune(b) {
			return true // not UTF-8 (a character cut where the peek ends is not judged)
		}
		if r < 0x20 && r != '\t' && r != '\r' {
			return true
		}
		b = b[n:]
	}
	return false
}

// headerPrefix reports whether got is the start of CSVHeader, its last
// column maybe cut short.
func headerPrefix(got []string) bool {
	if len(got) == 0 || len(got) > len(CSVHeader) {
		return false
	}
	last := len(got) - 1
	return slices.Equal(got[:last], CSVHeader[:last]) && strings.HasPrefix(CSVHeader[last], got[last])
}

func checkHeader(got []string) error {
	for i, want := range CSVHeader {
		if i < len(got) && got[i] == want {
			continue
		}
		found := false
		for _, g := range got {
			if g == want {
				found = true
			}
		}
		if !found {
			if i < len(got) {
				return fmt.Errorf("missing column %q (column %d is %q)", want, i+1, got[i])
			}
			return fmt.Errorf("missing column %q", want)
		}
		return fmt.Errorf("column %d is %q, want %q", i+1, got[i], want)
	}
	if len(got) > len(CSVHeader) {
		return fmt.Errorf("unexpected column %d %q after %q", len(CSVHeader)+1, got[len(CSVHeader)], CSVHeader[len(CSVHeader)-1])
	}
	return nil
}

// Line returns the number of lines read so far.
func (r *csvReader) Line() int { return r.line }

// Next returns the next event, or (nil, nil) at the end of the file. Each
// event is freshly allocated and may be kept.
func (r *csvReader) Next() (*Event, error) {
	if r.err != nil {
		return nil, r.err
	}
	start, err := r.readRecord()
	if err == io.EOF {
		return nil, nil
	}
	if err != nil {
		r.err = r.errorf(start, "%s", err)
		return nil, r.err
	}
	if len(r.ends) != numCols {
		if r.noNewline {
			r.err = r.errorf(start, "truncated last line: %d fields, want %d%s", len(r.ends), numCols, CutShort)
		} else {
			r.err = r.errorf(start, "wrong number of fields: %d, want %d", len(r.ends), numCols)
		}
		return nil, r.err
	}
	if r.noNewline {
		// Every row the writer writes ends with a line end: a last line
		// without one was cut, maybe inside its last field ("N/" for "N/A",
		// a number short of digits), which would still parse.
		r.err = r.errorf(start, "truncated last line: no line end after the last field%s", CutShort)
		return nil, r.err
	}
	e := new(Event)
	if err := r.fill(e); err != nil {
		r.err = r.errorf(start, "%s", err)
		return nil, r.err
	}
	return e, nil
}

func (r *csvReader) fill(e *Event) error {
	var ok bool
	f := r.field(colID)
	if e.ID, ok = parseUintDec(f); !ok {
		return fmt.Errorf("bad ID %q", f)
	}
	f = r.field(colEvent)
	if e.Kind = kindOf(f); e.Kind == 0 {
		return fmt.Errorf("unknown Event kind %q", f)
	}
	e.Type = r.str(colType, false)
	e.Name = r.str(colName, true)
	f = r.field(colTimestamp)
	if e.Timestamp, ok = parseUintDec(f); !ok {
		return fmt.Errorf("bad Timestamp(ns) %q", f)
	}
	f = r.field(colPid)
	if e.Pid, ok = parseIntDec(f); !ok {
		return fmt.Errorf("bad Process Id %q", f)
	}
	f = r.field(colTid)
	if e.Tid, ok = parseIntDec(f); !ok {
		return fmt.Errorf("bad Thread Id %q", f)
	}
	e.Device = r.str(colDevice, true)
	f = r.field(colPtr)
	if string(f) != NA {
		if e.Ptr, ok = parseHexPtr(f); !ok {
			return fmt.Errorf("bad Ptr %q", f)
		}
		e.HasPtr = true
	}
	ptr, hasPtr := e.Ptr, e.HasPtr
	if err := parseAttr(e, r.field(colAttr), r.intern.get, bytesString); err != nil {
		return err
	}
	if e.IsMemory() && (!hasPtr || ptr != e.Ptr) {
		return fmt.Errorf("Attr addr 0x%x does not match Ptr %q", e.Ptr, r.field(colPtr))
	}
	e.PyStack = r.str(colPyStack, true)
	e.CStack = r.str(colCStack, true)
	return nil
}

func bytesString(b []byte) string { return string(b) }

// str returns column col as a string: shared with the previous row's when
// equal (the cheap common case), else interned; "N/A" is "" when na is set.
func (r *csvReader) str(col int, na bool) string {
	b := r.field(col)
	if string(b) == r.last[col] {
		return r.last[col]
	}
	if na && string(b) == NA {
		return ""
	}
	s := r.intern.get(b)
	r.last[col] = s
	return s
}

func (r *csvReader) field(i int) []byte {
	start := 0
	if i > 0 {
		start = r.ends[i-1]
	}
	return r.rec[start:r.ends[i]]
}

func (r *csvReader) errorf(line int, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	msg = strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(msg)
	return errors.New(r.name + ":" + strconv.Itoa(line) + ": " + msg)
}

func kindOf(b []byte) Kind {
	for k, n := range kindNames {
		if n != "" && string(b) == n {
			return Kind(k)
		}
	}
	return 0
}

// readLine returns the next line with its '\n', or what is left before EOF.
// The slice is valid until the next read.
func (r *csvReader) readLine() ([]byte, error) {
	line, err := r.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		r.long = append(r.long[:0], line...)
		for err == bufio.ErrBufferFull {
			if len(r.long) > maxLineBytes {
				return nil, fmt.Errorf("line longer than %d bytes", maxLineBytes)
			}
			line, err = r.br.ReadSlice('\n')
			r.long = append(r.long, line...)
		}
		line = r.long
	}
	if len(line) > 0 {
		r.line++
		r.noNewline = line[len(line)-1] != '\n'
		if err == io.EOF {
			err = nil
		}
	}
	return line, err
}

// eolLen is the length of the line end at the end of line ("\n" or "\r\n").
func eolLen(line []byte) int {
	n := len(line)
	if n > 0 && line[n-1] == '\n' {
		if n > 1 && line[n-2] == '\r' {
			return 2
		}
		return 1
	}
	return 0
}

// readRecord reads one record into rec/ends and returns the line it starts on.
// io.EOF means there are no more records.
func (r *csvReader) readRecord() (int, error) {
	var line []byte
	var err error
	for {
		line, err = r.readLine()
		if err != nil {
			return r.line + 1, err
		}
		if eolLen(line) != len(line) {
			break // not an empty line
		}
	}
	start := r.line
	r.rec, r.ends = r.rec[:0], r.ends[:0]
	col := 1
	q := bytes.IndexByte(line, '"') // the next '"' at or after the current field, or -1
field:
	for {
		if len(line) == 0 || line[0] != '"' {
			i := bytes.IndexByte(line, ',')
			end := i
			if i < 0 {
				end = len(line) - eolLen(line)
			}
			if q >= 0 && q < end {
				return start, fmt.Errorf("bare \" in non-quoted field %d", col)
			}
			r.rec = append(r.rec, line[:end]...)
			r.ends = append(r.ends, len(r.rec))
			if i < 0 {
				return start, nil
			}
			line = line[i+1:]
			q -= i + 1
			col++
			continue
		}
		line = line[1:] // the opening quote
		for {
			i := bytes.IndexByte(line, '"')
			switch {
			case i >= 0:
				r.rec = append(r.rec, line[:i]...)
				line = line[i+1:]
				switch {
				case len(line) > 0 && line[0] == '"':
					r.rec = append(r.rec, '"')
					line = line[1:]
				case len(line) > 0 && line[0] == ',':
					r.ends = append(r.ends, len(r.rec))
					line = line[1:]
					q = bytes.IndexByte(line, '"')
					col++
					continue field
				case eolLen(line) == len(line):
					r.ends = append(r.ends, len(r.rec))
					return start, nil
				default:
					return start, fmt.Errorf("extraneous or missing \" in quoted field %d", col)
				}
			case len(line) > 0:
				r.rec = append(r.rec, line...)
				if len(r.rec) > maxLineBytes {
					return start, fmt.Errorf("record longer than %d bytes", maxLineBytes)
				}
				if line, err = r.readLine(); err != nil {
					if err == io.EOF {
						return start, fmt.Errorf("truncated last line: unterminated quoted field %d%s", col, CutShort)
					}
					return start, err
				}
			default:
				return start, fmt.Errorf("truncated last line: unterminated quoted field %d%s", col, CutShort)
			}
		}
	}
}

// interner shares the strings that repeat from row to row. It stops growing at
// a fixed size, so memory stays bounded whatever the file.
type interner struct {
	m     map[string]string
	bytes int
}

const (
	maxInternEntries = 1 << 16
	maxInternBytes   = 32 << 20
)

func (in *interner) get(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := in.m[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(in.m) < maxInternEntries && in.bytes+len(s) <= maxInternBytes {
		in.m[s] = s
		in.bytes += len(s)
	}
	return s
}
