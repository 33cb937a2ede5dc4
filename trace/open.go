package trace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
	// Capture reads a capture folder's spool, whole, even where it holds
	// dumps (the newest, read otherwise, may be one --steps filtered).
	Capture bool
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
// header without the columns of SPEC §2.1, a database without the table, a
// file cut short (a CSV whose last line has no line end, a database shorter
// than its header says) and, for a dump in its capture folder, a number of
// rows other than its config.json's events_written (dumpcheck.go).
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
	rc, err := expectedRows(path)
	if err != nil {
		f.Close()
		return nil, err
	}
	var magic [len(sqliteMagic)]byte
	n, _ := io.ReadFull(f, magic[:])
	if string(magic[:n]) == sqliteMagic {
		f.Close()
		return openSQLiteInput(path, opt, rc)
	}
	if strings.EqualFold(filepath.Ext(path), ".db") {
		f.Close()
		return nil, fmt.Errorf("%s: not an SQLite database", path)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	in, err := newCSVInput(f, path, fi.Size(), opt, rc)
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

// ReadFile reads every row of a dump file at once (small files: tests,
// comparisons).
func ReadFile(path string) ([]Event, error) {
	in, err := Open(path, OpenOptions{})
	if err != nil {
		return nil, err
	}
	defer in.Close()
	return ReadAll(in)
}
