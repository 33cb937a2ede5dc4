package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"msmemscope/internal/safefs"
)

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
