package trace

import (
	"bufio"
	"cmp"
	"container/heap"
	"errors"
	"io"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"msmemscope/internal/safefs"
)

// IneffWriter adds inefficiency results to the MALLOC rows of a dump CSV
// while the analysis that finds them still reads it (check_inefficient,
// SPEC §5.3). The new file is what AddInefficient writes, built in a
// temporary file renamed over the old one by Commit: the rows that gain
// results are written anew, everything in between is copied by the kernel
// (copy_file_range) without being read, and the copy's writeback is started
// as it goes, so that the rename does not wait for a whole file's worth of
// it (ext4 flushes a file renamed over another).
//
// The analysis tells where its rows are (Input.Offset of an input opened
// with IndexMallocs) and how far it is sure of them:
//
//   - Final(off): no row before off gets results, except those pinned or
//     added. The copy runs up to there in the background, at the same time
//     as the analysis; it starts with the first result, so that a file that
//     gets none is never copied.
//   - Pin(off): the block whose MALLOC row starts at off has a result, but
//     may get more: the copy stops before its row until Add.
//   - Add(off, m): the row's results, final.
//
// For the rows of blocks still alive, Final is a guess (they may yet get
// results): a Pin or Add behind the copy undoes it back to that row, and
// the writer stops guessing: the rest waits for Commit. Offsets that do not
// match the file make Commit find the rows by ID instead, as
// AddInefficient does. The writer is not for concurrent use, except that
// its copy runs alongside the caller.
type IneffWriter struct {
	path string

	mu      sync.Mutex
	cond    sync.Cond
	started bool
	rows    []ineffRow // the results, by offset
	pins    pinHeap    // offsets of pinned rows; a popped pin is one no longer in pinned
	pinned  map[int64]bool
	final   int64       // Final's offset
	claimed int64       // the copy runs up to here without looking back
	redo    int64       // the copy must be undone back to here (MaxInt64: no)
	guessed bool        // a guess failed: Final no longer moves the copy
	stale   bool        // an offset was unknown: Commit rewrites by scanning
	lost    []IneffMark // results given once stale
	commit  bool
	abort   bool

	src         *os.File     // the old file, read by the copy
	done, total atomic.Int64 // Progress
	added       int
	errc        chan error
	scanned     bool // Commit found the rows by ID (for tests)
}

type ineffRow struct {
	off  int64
	mark IneffMark
}

func rowAt(r ineffRow, off int64) int { return cmp.Compare(r.off, off) }

// NewIneffWriter returns a writer for the dump CSV at path. Nothing happens
// until a result is found.
func NewIneffWriter(path string) *IneffWriter {
	w := &IneffWriter{path: path, pinned: map[int64]bool{}, redo: math.MaxInt64}
	w.cond.L = &w.mu
	return w
}

// Pin says the MALLOC row at off has results still open.
func (w *IneffWriter) Pin(off int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.touch(off) {
		return
	}
	if !w.pinned[off] {
		w.pinned[off] = true
		heap.Push(&w.pins, off)
	}
}

// Add gives the results of the MALLOC row at off, whose ID is m.ID.
func (w *IneffWriter) Add(off int64, m IneffMark) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.touch(off) {
		w.lost = append(w.lost, m)
		return
	}
	delete(w.pinned, off)
	// Rows come roughly in file order: inserting is cheap.
	if i, found := slices.BinarySearchFunc(w.rows, off, rowAt); found {
		w.rows[i].mark = m // a row holds one block: not expected
	} else {
		w.rows = slices.Insert(w.rows, i, ineffRow{off, m})
	}
	w.cond.Signal()
}

// touch starts the copy with the first result and notes a failed guess; it
// reports false once an offset was unknown (Commit then scans). w.mu is held.
func (w *IneffWriter) touch(off int64) bool {
	if off < 0 {
		w.stale = true
		w.cond.Signal()
	}
	if w.stale {
		return false
	}
	if !w.started {
		w.started = true
		errc := make(chan error, 1)
		w.errc = errc
		go func() {
			errc <- safefs.ReplaceFile(w.path, w.copy)
			// The old file goes when its last descriptor does: dropping
			// its pages (a whole file's worth) is left out of Commit.
			if w.src != nil {
				w.src.Close()
			}
		}()
	}
	if off < w.claimed {
		w.redo = min(w.redo, off)
		w.guessed = true
		w.cond.Signal()
	}
	return true
}

// Final says no row before off gets results but the pinned and added ones.
func (w *IneffWriter) Final(off int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.guessed && off > w.final {
		w.final = off
		w.cond.Signal()
	}
}

// Progress reports how far Commit's copy has got.
func (w *IneffWriter) Progress() (done, total int64) { return w.done.Load(), w.total.Load() }

// Commit writes the rest of the file and renames it over the old one, when
// there was something new. Every result must have been added. It returns
// the number of results added.
func (w *IneffWriter) Commit() (int, error) {
	w.mu.Lock()
	if !w.started && !w.stale {
		w.mu.Unlock()
		return 0, nil
	}
	w.commit = true
	w.cond.Signal()
	w.mu.Unlock()
	err := errStale
	if w.errc != nil {
		err = <-w.errc
		w.errc = nil
	}
	switch {
	case err == nil:
		return w.added, nil
	case errors.Is(err, errNothingNew):
		return 0, nil
	case errors.Is(err, errStale):
		// The offsets do not match the file: find the rows by ID.
		w.scanned = true
		marks := w.lost
		for _, r := range w.rows {
			marks = append(marks, r.mark)
		}
		slices.SortStableFunc(marks, func(a, b IneffMark) int { return cmp.Compare(a.ID, b.ID) })
		return addIneffCSV(w.path, marks, func(done, total int64) { w.done.Store(done); w.total.Store(total) })
	}
	return 0, err
}

// Abort drops the new file, unless Commit was called.
func (w *IneffWriter) Abort() {
	w.mu.Lock()
	w.abort = true
	w.cond.Signal()
	errc := w.errc
	w.errc = nil
	w.mu.Unlock()
	if errc != nil && !w.commit {
		<-errc
	}
}

var (
	errStale   = errors.New("row offsets do not match the file")
	errAborted = errors.New("aborted")
)

// writebackPiece is how much is copied before its writeback is started (a
// variable for tests).
var writebackPiece int64 = 8 << 20

// copy builds the new file in dst; it runs in its own goroutine.
func (w *IneffWriter) copy(dst *os.File) error {
	src, err := os.Open(w.path)
	if err != nil {
		return err
	}
	w.src = src // closed after the rename
	st, err := src.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	w.total.Store(size)
	c := ineffCopy{src: src, dst: dst, size: size, done: &w.done, p: newChunkParser(w.path, false), br: bufio.NewReaderSize(nil, 64<<10)}
	c.cw = NewCSVWriter(dst)
	c.cw.header = true
	for {
		limit, todo, commit, err := w.next(&c)
		if err != nil {
			return err
		}
		for _, r := range todo {
			if err := c.row(r); err != nil {
				return err
			}
		}
		if err := c.copyTo(limit); err != nil {
			return err
		}
		if commit && c.pos == size {
			w.added = c.added
			if c.added == 0 {
				return errNothingNew
			}
			return nil
		}
	}
}

// next waits until the copy can go on, undoes it after a failed guess, and
// returns how far it goes now (limit) and the rows to rewrite on the way.
func (w *IneffWriter) next(c *ineffCopy) (limit int64, todo []ineffRow, commit bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		switch {
		case w.abort && !w.commit:
			return 0, nil, false, errAborted
		case w.stale:
			return 0, nil, false, errStale
		}
		limit = w.final
		for len(w.pins) > 0 && !w.pinned[w.pins[0]] {
			heap.Pop(&w.pins)
		}
		if len(w.pins) > 0 {
			limit = min(limit, w.pins[0])
		}
		if w.commit {
			limit = c.size
		}
		if w.redo < c.pos || limit > c.pos || w.commit {
			break
		}
		w.cond.Wait()
	}
	if w.redo < c.pos {
		if err := c.undo(w.redo); err != nil {
			return 0, nil, false, err
		}
	}
	w.redo = math.MaxInt64
	limit = min(max(limit, c.pos), c.size)
	w.claimed = limit
	i, _ := slices.BinarySearchFunc(w.rows, c.pos, rowAt)
	j, _ := slices.BinarySearchFunc(w.rows, limit, rowAt)
	return limit, slices.Clone(w.rows[i:j]), w.commit, nil
}

// ineffCopy is the state of IneffWriter.copy.
type ineffCopy struct {
	src, dst *os.File
	size     int64
	pos, out int64 // the input up to pos is written: out bytes of output
	wbFrom   int64 // output not yet handed to writeback starts here
	done     *atomic.Int64
	grown    []rowGrowth
	added    int
	p        *chunkParser
	br       *bufio.Reader
	raw      []byte
	cw       *CSVWriter
}

// rowGrowth is a rewritten row: where it starts in the input, how many bytes
// longer it became, and how many results it gained.
type rowGrowth struct {
	off, by int64
	added   int
}

// copyTo copies the input from c.pos to end as it is.
func (c *ineffCopy) copyTo(end int64) error {
	for c.pos < end {
		n := min(end-c.pos, writebackPiece)
		if _, err := c.src.Seek(c.pos, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(c.dst, c.src, n); err != nil {
			return err
		}
		c.pos += n
		c.out += n
		c.done.Store(c.pos)
		c.writeback()
	}
	return nil
}

// writeback starts writing the output made so far to disk.
func (c *ineffCopy) writeback() {
	if c.out-c.wbFrom >= writebackPiece {
		_ = unix.SyncFileRange(int(c.dst.Fd()), c.wbFrom, c.out-c.wbFrom, unix.SYNC_FILE_RANGE_WRITE)
		c.wbFrom = c.out
	}
}

// row copies the input up to r's row, then writes the row with r's results
// added.
func (c *ineffCopy) row(r ineffRow) error {
	if r.off < c.pos || r.off >= c.size {
		return errStale
	}
	c.br.Reset(io.NewSectionReader(c.src, r.off, c.size-r.off))
	raw, _, _, err := readRawRecord(c.br, c.raw)
	c.raw = raw
	if err != nil {
		return errStale
	}
	if id, ok := leadingID(raw); !ok || id != r.mark.ID {
		return errStale
	}
	e, err := c.p.one(raw, 0)
	if err != nil || e.Kind != KindMalloc {
		return errStale
	}
	s, n := MergeIneff(e.Inefficient, r.mark.Types)
	if n == 0 {
		return nil // copied with the rest
	}
	if err := c.copyTo(r.off); err != nil {
		return err
	}
	e.Inefficient = s
	if err := c.cw.Write(e); err != nil {
		return err
	}
	m := int64(len(c.cw.buf))
	if err := c.cw.flushBuf(); err != nil {
		return err
	}
	c.added += n
	c.grown = append(c.grown, rowGrowth{r.off, m - int64(len(raw)), n})
	c.pos = r.off + int64(len(raw))
	c.out += m
	return nil
}

// undo truncates the output back to where input offset off was copied.
func (c *ineffCopy) undo(off int64) error {
	out := off
	i := 0
	for i < len(c.grown) && c.grown[i].off < off {
		out += c.grown[i].by
		i++
	}
	for _, g := range c.grown[i:] {
		c.added -= g.added // counted again when written again
	}
	c.grown = c.grown[:i]
	if err := c.dst.Truncate(out); err != nil {
		return err
	}
	if _, err := c.dst.Seek(out, io.SeekStart); err != nil {
		return err
	}
	c.pos, c.out, c.wbFrom = off, out, min(c.wbFrom, out)
	return nil
}

// pinHeap is a min-heap of offsets.
type pinHeap []int64

func (h pinHeap) Len() int           { return len(h) }
func (h pinHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h pinHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pinHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *pinHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
