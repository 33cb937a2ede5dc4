package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"msmemscope/internal/safefs"
)

// Input is a dump file opened for reading (CSV, SPEC §2.1, or SQLite, §2.2):
// a Stream of its rows in ID order, plus what offline tools need.
//
// Events returned by Next are not shared with later calls and may be kept,
// but an Input hands them out in blocks of a few thousand that stay in memory
// as long as one of them is referenced: keep copies of what you need rather
// than many *Event.
type Input interface {
	Stream
	Path() string
	Format() string // "csv" or "db"
	// Progress reports how far reading has got: done of total (bytes for
	// CSV, row IDs for SQLite); total may be 0 when unknown.
	Progress() (done, total int64)
	// Lookup calls fn, in file order, with the complete event (every column)
	// of each row whose ID is in ids, which must be sorted. It reads the
	// file again and leaves Next's position alone.
	Lookup(ids []uint64, fn func(*Event) error) error
	// Offset returns where the row Next returned last starts in the file
	// when it is a MALLOC row of a CSV opened with IndexMallocs; -1
	// otherwise.
	Offset() int64
	Close() error
}

// RowOffset is where a row starts in a CSV file.
type RowOffset struct {
	ID  uint64
	Off int64
}

// OpenOptions tune Open.
type OpenOptions struct {
	// Lean leaves out what analyses rarely need and what costs most to read:
	// Extra (the Attr pairs other than the typed ones), PyStack and CStack.
	// Every column is still checked. Lookup gives complete rows.
	Lean bool
	// Workers is the number of goroutines parsing CSV (0: GOMAXPROCS, at
	// most 4).
	Workers int
	// Reuse lets the input recycle events: an event returned by Next is
	// valid only until a few thousand more have been read. For analyses
	// that copy what they keep; it saves allocating and collecting.
	Reuse bool
	// IndexMallocs makes a CSV input tell where each MALLOC row it returns
	// starts in the file (Offset): an IneffWriter then copies the rest of
	// the file without reading it.
	IndexMallocs bool
	// Kinds, when not empty, keeps only rows of these kinds: the others
	// are skipped as soon as their Event column is read, unchecked beyond
	// it (an analysis needs only its rows to be well formed).
	Kinds []Kind
}

// kindMask is a set of kinds; 0 is every kind.
type kindMask uint32

func maskOf(kinds []Kind) kindMask {
	var m kindMask
	for _, k := range kinds {
		m |= 1 << k
	}
	return m
}

func (m kindMask) has(k Kind) bool { return m == 0 || m&(1<<k) != 0 }

// Formats of dump files.
const (
	FormatCSV = "csv"
	FormatDB  = "db"
)

// Open opens a dump file, CSV or SQLite (told apart by content, not by
// name). Errors are one line naming the file: a missing file, a folder, a
// header without the columns of SPEC §2.1, a database without the table.
func Open(path string, opt OpenOptions) (Input, error) {
	fi, err := os.Stat(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s: %w, not a dump file (memscope_dump_*.csv or .db)", path, syscall.EISDIR)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, errors.Unwrap(err))
	}
	var magic [len(sqliteMagic)]byte
	n, _ := io.ReadFull(f, magic[:])
	if string(magic[:n]) == sqliteMagic {
		f.Close()
		return openSQLiteInput(path, opt)
	}
	if strings.EqualFold(filepath.Ext(path), ".db") {
		f.Close()
		return nil, fmt.Errorf("%s: not an SQLite database", path)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	in, err := newCSVInput(f, path, fi.Size(), opt)
	if err != nil {
		f.Close()
		return nil, err
	}
	return in, nil
}

// DetectFormat tells a dump file's format from its first bytes.
func DetectFormat(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var magic [len(sqliteMagic)]byte
	n, _ := io.ReadFull(f, magic[:])
	if string(magic[:n]) == sqliteMagic {
		return FormatDB, nil
	}
	return FormatCSV, nil
}

// ---------------------------------------------------------------------------
// CSV input: records are cut into chunks of whole records by one goroutine
// and parsed by several; events come out in file order. Each record takes a
// fast path (fields split in place, one allocation per chunk) and anything
// unusual (a quoted field holding "" or a line end, a stray quote, a wrong
// number of fields, a value that does not parse) is handed to CSVReader, so
// the events and the errors are exactly CSVReader's.

// csvChunkSize is how much a chunk reads at a time (a variable for tests).
var csvChunkSize = 1 << 20

type csvChunk struct {
	buf  *[]byte // the buffer data is in, to recycle
	data []byte  // whole records (the last chunk: whatever is left)
	line int     // the line number of data's first line, 1-based
	off  int64   // the file offset of data
	res  chan csvResult
}

type csvResult struct {
	events []Event
	offs   []RowOffset // of the MALLOC rows, with IndexMallocs
	err    error
}

type csvInput struct {
	f      io.Closer
	mapped []byte // the file, when mapped (csvMapMin)
	path   string
	size   int64
	read   atomic.Int64
	lean   bool
	reuse  bool
	kinds  kindMask
	pool   sync.Pool // []Event batches to recycle (Reuse)
	bufs   sync.Pool // chunk buffers to recycle
	order  chan *csvChunk
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	index   bool
	offs    []RowOffset // of the MALLOC rows in cur, with IndexMallocs
	oi      int         // offs[oi] is the next MALLOC row's
	off     int64       // Offset
	cur     []Event
	i       int
	pending error
	err     error
	done    bool
}

func newCSVInput(f io.ReadCloser, path string, size int64, opt OpenOptions) (*csvInput, error) {
	in := &csvInput{f: f, path: path, size: size, lean: opt.Lean, reuse: opt.Reuse, kinds: maskOf(opt.Kinds),
		index: opt.IndexMallocs, stop: make(chan struct{})}
	var src io.Reader = f
	if of, ok := f.(*os.File); ok && size >= csvMapMin && size == int64(int(size)) {
		// Parsed where the page cache holds it: no copy into buffers.
		if m, err := unix.Mmap(int(of.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED); err == nil {
			_ = unix.Madvise(m, unix.MADV_SEQUENTIAL)
			in.mapped = m
			src = bytes.NewReader(m)
		}
	}
	br := bufio.NewReaderSize(src, 64<<10)
	// The header, checked as CSVReader checks it.
	ho := &headerOnly{br: br}
	var hr *CSVReader
	err := in.faults(func() error {
		var err error
		hr, err = NewCSVReader(ho, path)
		return err
	})
	if err != nil {
		in.unmap()
		return nil, err
	}
	hdrLines := hr.Line()
	workers := opt.Workers
	if workers <= 0 {
		workers = min(runtime.GOMAXPROCS(0), 4)
	}
	in.order = make(chan *csvChunk, 2*workers+2)
	jobs := make(chan *csvChunk, workers)
	for range workers {
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			p := newChunkParser(path, opt.Lean)
			p.kinds = in.kinds
			p.index = in.index
			for c := range jobs {
				var evs []Event
				if in.reuse {
					if b, ok := in.pool.Get().(*[]Event); ok {
						evs = (*b)[:0]
					}
				}
				p.offs = nil
				err := in.faults(func() error {
					var err error
					evs, err = p.parse(evs, c.data, c.line, c.off)
					return err
				})
				// Events hold no reference to the chunk's bytes.
				if c.buf != nil {
					in.bufs.Put(c.buf)
				} else {
					in.release(c.data)
				}
				c.res <- csvResult{evs, p.offs, err}
			}
		}()
	}
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		defer close(jobs)
		defer close(in.order)
		if in.mapped == nil {
			in.produce(br, hdrLines+1, ho.n, jobs)
			return
		}
		line, off := hdrLines+1, ho.n
		if err := in.faults(func() error { return in.produceMapped(&line, &off, jobs) }); err != nil {
			in.send(&csvChunk{line: line, res: errResult(err)}, jobs)
		}
	}()
	return in, nil
}

// headerOnly reads one line at most from br: NewCSVReader must consume the
// header row and nothing else.
type headerOnly struct {
	n     int64 // bytes read
	br    *bufio.Reader
	done  bool
	quot  bool // inside a quoted field
	chars int  // characters of the current line other than line ends
}

func (h *headerOnly) Read(p []byte) (int, error) {
	if h.done {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) {
		c, err := h.br.ReadByte()
		if err != nil {
			if n == 0 {
				return 0, err
			}
			return n, nil
		}
		p[n] = c
		n++
		h.n++
		if c == '"' {
			h.quot = !h.quot
		}
		if c != '\n' && c != '\r' {
			h.chars++
		}
		if c == '\n' && !h.quot {
			if h.chars > 0 { // CSVReader skips empty lines before the header
				h.done = true
				break
			}
		}
	}
	return n, nil
}

// produce cuts the file into chunks of whole records.
func (in *csvInput) produce(br *bufio.Reader, line int, off int64, jobs chan<- *csvChunk) {
	var carry []byte
	eof := false
	for !eof {
		want := max(csvChunkSize, 2*len(carry))
		var bp *[]byte
		if b, ok := in.bufs.Get().(*[]byte); ok && cap(*b) >= want {
			bp = b
		} else {
			nb := make([]byte, 0, want)
			bp = &nb
		}
		buf := append((*bp)[:0], carry...)
		for len(buf) < cap(buf) {
			n, err := br.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			in.read.Add(int64(n))
			if err == io.EOF {
				eof = true
				break
			}
			if err != nil {
				in.send(&csvChunk{line: line, res: errResult(fmt.Errorf("%s:%d: %v", in.path, line, err))}, jobs)
				return
			}
		}
		cut, lines := len(buf), 0
		if !eof {
			cut, lines = recordsEnd(buf)
			if cut == 0 && len(buf) > maxLineBytes {
				cut = len(buf) // let CSVReader report the record that is too long
			}
		}
		if cut == 0 {
			carry = append([]byte(nil), buf...)
			continue
		}
		c := &csvChunk{buf: bp, data: buf[:cut], line: line, off: off, res: make(chan csvResult, 1)}
		carry = append(carry[:0], buf[cut:]...) // before the chunk is parsed and recycled
		if !in.send(c, jobs) {
			return
		}
		if eof {
			return
		}
		line += lines
		off += int64(cut)
	}
}

// produceMapped cuts the mapped file into chunks of whole records; line and
// off follow the chunk being cut.
func (in *csvInput) produceMapped(line *int, off *int64, jobs chan<- *csvChunk) error {
	m := in.mapped
	for *off < int64(len(m)) {
		end := min(*off+int64(csvChunkSize), int64(len(m)))
		cut, lines := int(end-*off), 0
		for end < int64(len(m)) {
			cut, lines = recordsEnd(m[*off:end])
			if cut > 0 {
				break
			}
			if end-*off > maxLineBytes { // let CSVReader report the record that is too long
				cut = int(end - *off)
				break
			}
			end = min(end+int64(csvChunkSize), int64(len(m)))
			cut = int(end - *off)
		}
		c := &csvChunk{data: m[*off : *off+int64(cut)], line: *line, off: *off, res: make(chan csvResult, 1)}
		in.read.Store(*off + int64(cut))
		if !in.send(c, jobs) {
			return nil
		}
		*line += lines
		*off += int64(cut)
	}
	return nil
}

// csvMapMin is the size from which a CSV file is mapped rather than read (a
// variable for tests).
var csvMapMin int64 = 4 << 20

// faults runs fn, turning a fault on the mapped file (it shrank while being
// read: SIGBUS) into an error instead of a crash.
func (in *csvInput) faults(fn func() error) (err error) {
	if in.mapped == nil {
		return fn()
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = fmt.Errorf("%s: the file shrank while it was read", in.path)
		}
	}()
	return fn()
}

// release drops the pages wholly inside b, a parsed chunk of the mapped
// file, from this process (the page cache keeps them): the mapping would
// otherwise count the whole file in the process's resident size.
func (in *csvInput) release(b []byte) {
	if len(b) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(&in.mapped[0]))
	start := uintptr(unsafe.Pointer(&b[0])) - base
	end := start + uintptr(len(b))
	pg := uintptr(os.Getpagesize())
	start = (start + pg - 1) &^ (pg - 1)
	end &^= pg - 1
	if end > start {
		_ = unix.Madvise(in.mapped[start:end], unix.MADV_DONTNEED)
	}
}

func (in *csvInput) unmap() {
	if in.mapped != nil {
		_ = unix.Munmap(in.mapped)
		in.mapped = nil
	}
}

func errResult(err error) chan csvResult {
	ch := make(chan csvResult, 1)
	ch <- csvResult{err: err}
	return ch
}

func (in *csvInput) send(c *csvChunk, jobs chan<- *csvChunk) bool {
	select {
	case in.order <- c:
	case <-in.stop:
		return false
	}
	if c.data == nil {
		return true // an error: nothing to parse
	}
	select {
	case jobs <- c:
		return true
	case <-in.stop:
		c.res <- csvResult{err: errors.New("closed")}
		return false
	}
}

// recordsEnd returns the length of the longest prefix of b made of whole
// records (outside quotes, ending with '\n') and the number of lines in it.
func recordsEnd(b []byte) (cut, lines int) {
	// Usually the quotes before the last line end balance: it ends a record.
	if last := bytes.LastIndexByte(b, '\n'); last >= 0 && bytes.Count(b[:last+1], quoteByte)&1 == 0 {
		return last + 1, bytes.Count(b[:last+1], newlineByte)
	}
	odd := false
	n := 0
	for p := 0; p < len(b); {
		i := bytes.IndexByte(b[p:], '\n')
		if i < 0 {
			break
		}
		if bytes.Count(b[p:p+i], quoteByte)&1 == 1 {
			odd = !odd
		}
		p += i + 1
		n++
		if !odd {
			cut, lines = p, n
		}
	}
	return cut, lines
}

var quoteByte, newlineByte = []byte{'"'}, []byte{'\n'}

func (in *csvInput) Next() (*Event, error) {
	if in.err != nil {
		return nil, in.err
	}
	for in.i >= len(in.cur) {
		if in.pending != nil {
			in.err, in.cur = in.pending, nil
			return nil, in.err
		}
		if in.done {
			return nil, nil
		}
		c, ok := <-in.order
		if !ok {
			in.done, in.cur = true, nil
			return nil, nil
		}
		r := <-c.res
		in.offs, in.oi = r.offs, 0
		if in.reuse && in.cur != nil {
			b := in.cur[:0]
			in.pool.Put(&b)
		}
		in.cur, in.i, in.pending = r.events, 0, r.err
	}
	e := &in.cur[in.i]
	in.i++
	in.off = -1
	// offs holds the chunk's MALLOC rows in order: the next one is e's.
	if in.index && e.Kind == KindMalloc && in.oi < len(in.offs) && in.offs[in.oi].ID == e.ID {
		in.off = in.offs[in.oi].Off
		in.oi++
	}
	return e, nil
}

func (in *csvInput) Offset() int64 { return in.off }

func (in *csvInput) Path() string   { return in.path }
func (in *csvInput) Format() string { return FormatCSV }
func (in *csvInput) Progress() (int64, int64) {
	return in.read.Load(), in.size
}

func (in *csvInput) Close() error {
	in.once.Do(func() {
		close(in.stop)
		go func() { // unblock the producer and the workers
			for c := range in.order {
				<-c.res
			}
		}()
		in.wg.Wait()
		in.unmap()
		in.f.Close()
	})
	return nil
}

func (in *csvInput) Lookup(ids []uint64, fn func(*Event) error) error {
	if len(ids) == 0 {
		return nil
	}
	f, err := os.Open(in.path)
	if err != nil {
		return fmt.Errorf("%s: %v", in.path, err)
	}
	defer f.Close()
	left := len(ids)
	p := newChunkParser(in.path, false)
	return scanCSVRecords(f, in.path, func(raw []byte, line int, id uint64, ok bool) (bool, error) {
		if !ok {
			return true, nil
		}
		if _, found := slices.BinarySearch(ids, id); !found {
			return true, nil
		}
		e, err := p.one(raw, line)
		if err != nil {
			return false, err
		}
		if err := fn(e); err != nil {
			return false, err
		}
		left--
		return left > 0, nil
	}, nil)
}

// scanCSVRecords reads a dump CSV record by record without parsing it. fn
// gets each record's raw bytes (with its line end), the line it starts on,
// and its ID when the first field is a plain number (ok); it returns whether
// to go on. header, when set, gets the header row's raw bytes first.
func scanCSVRecords(r io.Reader, name string, fn func(raw []byte, line int, id uint64, ok bool) (bool, error), header func(raw []byte) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	var acc []byte
	line := 0
	first := true
	for {
		var lines int
		var eof bool
		var err error
		start := line + 1
		acc, lines, eof, err = readRawRecord(br, acc)
		line += lines
		if err != nil {
			return fmt.Errorf("%s:%d: %v", name, start, err)
		}
		if len(acc) > 0 {
			if first {
				first = false
				if header != nil {
					if err := header(acc); err != nil {
						return err
					}
				}
			} else {
				id, ok := leadingID(acc)
				goOn, err := fn(acc, start, id, ok)
				if err != nil || !goOn {
					return err
				}
			}
		}
		if eof {
			return nil
		}
	}
}

// readRawRecord reads one record's bytes (lines until the quotes balance)
// into acc. eof reports that the file ended.
func readRawRecord(br *bufio.Reader, acc []byte) (rec []byte, lines int, eof bool, err error) {
	acc = acc[:0]
	odd := false
	for {
		b, err := br.ReadSlice('\n')
		acc = append(acc, b...)
		if bytes.Count(b, quoteByte)&1 == 1 {
			odd = !odd
		}
		switch {
		case err == bufio.ErrBufferFull:
			if len(acc) > maxLineBytes {
				return acc, lines, false, fmt.Errorf("record longer than %d bytes", maxLineBytes)
			}
			continue
		case err == io.EOF:
			if len(b) > 0 {
				lines++
			}
			return acc, lines, true, nil
		case err != nil:
			return acc, lines, false, err
		}
		lines++
		if !odd {
			return acc, lines, false, nil
		}
	}
}

// leadingID parses the first field of a raw record when it is a number.
func leadingID(b []byte) (uint64, bool) {
	i := bytes.IndexByte(b, ',')
	if i <= 0 {
		return 0, false
	}
	return parseUintDec(b[:i])
}

// chunkParser parses chunks of records; one per worker.
type chunkParser struct {
	name   string
	lean   bool
	intern interner
	last   [numCols]string
	fb     *CSVReader // the slow path
	rd     bytes.Reader
	acc    []byte
	f      [numCols][]byte
	recent [numCols][8]string
	kinds  kindMask
	skip   bool        // lead met a row of a kind not in kinds
	index  bool        // record where MALLOC rows start
	offs   []RowOffset // ... here
}

func newChunkParser(name string, lean bool) *chunkParser {
	p := &chunkParser{name: name, lean: lean, intern: interner{m: make(map[string]string, 256)}}
	p.fb = &CSVReader{
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
		q := bytes.Count(ln, quoteByte)
		raw := ln
		if q&1 == 1 { // a record over several lines: the slow path
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
	if q, nl := bytes.Count(raw, quoteByte), bytes.IndexByte(raw, '\n'); q&1 == 0 && (nl < 0 || nl == len(raw)-1) {
		e := new(Event)
		if p.fast(e, raw, q) {
			return e, nil
		}
		p.skip = false
	}
	return p.slow(raw, line)
}

// slow parses one raw record with CSVReader.
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

// str is CSVReader.str over the fast path's fields, with a few recent
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

// ---------------------------------------------------------------------------
// Adding results to a dump in place (check_inefficient, SPEC §5.3).

// IneffMark is inefficiency types found for the block whose MALLOC row has
// ID ID.
type IneffMark struct {
	ID    uint64
	Types []string
}

// MergeIneff adds types to the '|'-joined list old, keeping its order and
// never adding one twice; it returns the new list and how many were added.
func MergeIneff(old string, types []string) (string, int) {
	have := []string{}
	if old != "" {
		have = strings.Split(old, "|")
	}
	n := 0
	for _, t := range types {
		if !slices.Contains(have, t) {
			have = append(have, t)
			n++
		}
	}
	return strings.Join(have, "|"), n
}

// AddInefficient adds inefficiency results to the MALLOC rows of a dump file
// (sorted by ID), keeping the results already there and adding none twice.
// A CSV is rewritten through a temporary file renamed over it; a database is
// updated in one transaction. Nothing is written when nothing is new; on an
// error the file is left as it was. progress, when set, is told how far the
// rewrite has got (done, total). It returns the number of results added.
// (An IneffWriter does the same for a CSV while the analysis still reads it.)
func AddInefficient(path string, marks []IneffMark, progress func(done, total int64)) (int, error) {
	if len(marks) == 0 {
		return 0, nil
	}
	format, err := DetectFormat(path)
	if err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	if format == FormatDB {
		return addIneffDB(path, marks)
	}
	return addIneffCSV(path, marks, progress)
}

// markCursor finds marks by ID in a file whose IDs ascend: it moves
// forward through marks, and searches only when an ID goes back.
type markCursor struct {
	marks []IneffMark
	i     int
	last  uint64
}

func (c *markCursor) find(id uint64) (*IneffMark, bool) {
	if id < c.last {
		return findMark(c.marks, id)
	}
	c.last = id
	for c.i < len(c.marks) && c.marks[c.i].ID < id {
		c.i++
	}
	if c.i < len(c.marks) && c.marks[c.i].ID == id {
		return &c.marks[c.i], true
	}
	return nil, false
}

func findMark(marks []IneffMark, id uint64) (*IneffMark, bool) {
	i, ok := slices.BinarySearchFunc(marks, id, func(m IneffMark, id uint64) int {
		switch {
		case m.ID < id:
			return -1
		case m.ID > id:
			return 1
		}
		return 0
	})
	if !ok {
		return nil, false
	}
	return &marks[i], true
}

// errNothingNew stops a rewrite that would change nothing.
var errNothingNew = errors.New("nothing new")

func addIneffCSV(path string, marks []IneffMark, progress func(done, total int64)) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("%s: %v", path, err)
	}
	defer f.Close()
	total := int64(0)
	if fi, err := f.Stat(); err == nil {
		total = fi.Size()
	}
	p := newChunkParser(path, false)
	cr := &countingReader{r: f}
	added := 0
	var inner error // the rewrite's own error, unwrapped
	cur := &markCursor{marks: marks}
	// One pass: records are copied as they are, except the MALLOC rows that
	// get new results; a rewrite that added nothing is dropped.
	err = safefs.Replace(path, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<20)
		cw := NewCSVWriter(bw)
		cw.header = true
		rows := 0
		inner = scanCSVRecords(cr, path, func(raw []byte, line int, id uint64, ok bool) (bool, error) {
			if rows++; progress != nil && rows&0xffff == 0 {
				progress(cr.n, total)
			}
			if !ok {
				_, err := bw.Write(raw)
				return err == nil, err
			}
			if m, found := cur.find(id); found {
				e, err := p.one(raw, line)
				if err != nil {
					return false, err
				}
				if e.Kind == KindMalloc {
					if s, n := MergeIneff(e.Inefficient, m.Types); n > 0 {
						e.Inefficient = s
						added += n
						if err := cw.Write(e); err != nil {
							return false, err
						}
						return true, cw.flushBuf()
					}
				}
			}
			_, err := bw.Write(raw)
			return err == nil, err
		}, func(raw []byte) error {
			_, err := bw.Write(raw)
			return err
		})
		if inner != nil {
			return inner
		}
		if added == 0 {
			return errNothingNew
		}
		if progress != nil {
			progress(total, total)
		}
		return bw.Flush()
	})
	switch {
	case inner != nil:
		return 0, inner
	case added == 0:
		return 0, nil // nothing new: the file is left as it was
	case err != nil:
		return 0, err
	}
	return added, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
