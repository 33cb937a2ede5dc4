package trace

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CSV input: records are cut into chunks of whole records by one goroutine
// and parsed by several; events come out in file order. Each record takes a
// fast path (fields split in place, one allocation per chunk) and anything
// unusual (a quoted field holding "" or a line end, a stray quote, a wrong
// number of fields, a value that does not parse) is handed to csvReader, so
// the events and the errors are exactly csvReader's.

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
	rows   int         // records in the chunk, those of kinds left out included
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

	check *rowCheck // config.json's count of rows, or nil
	rows  uint64    // records read, those of kinds left out included

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

func newCSVInput(f io.ReadCloser, path string, size int64, opt OpenOptions, check *rowCheck) (*csvInput, error) {
	in := &csvInput{f: f, path: path, size: size, lean: opt.Lean, reuse: opt.Reuse, kinds: maskOf(opt.Kinds),
		index: opt.IndexMallocs, stop: make(chan struct{}), check: check}
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
	// The header, checked as csvReader checks it.
	ho := &headerOnly{br: br}
	var hr *csvReader
	err := in.faults(func() error {
		var err error
		hr, err = newCSVReader(ho, path)
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
				p.offs, p.rows = nil, 0
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
				c.res <- csvResult{evs, p.offs, p.rows, err}
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

// headerOnly reads one line at most from br: newCSVReader must consume the
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
			if h.chars > 0 { // csvReader skips empty lines before the header
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
				cut = len(buf) // let csvReader report the record that is too long
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
			if end-*off > maxLineBytes { // let csvReader report the record that is too long
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
			if err := in.check.check(in.path, in.rows); err != nil {
				in.err = err
				return nil, err
			}
			return nil, nil
		}
		r := <-c.res
		in.rows += uint64(r.rows)
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
