package collect

import (
	"fmt"
	"io"
	"path/filepath"

	"msmemscope/internal/safefs"
	"msmemscope/trace"
)

// RowWriter is what a dump's rows are written through: trace.CSVWriter or
// trace.SQLiteWriter (data_format csv or db).
type RowWriter interface {
	Write(e *trace.Event) error
	Rows() uint64
}

// DumpOptions say how a dump file is written.
type DumpOptions struct {
	Format string // "csv" or "db"
	// PythonTraces are python_trace CSVs that a database gets as table
	// python_trace_{Pid} (SPEC §2.2).
	PythonTraces []string
	Pid          int64
}

// WriteDump writes a new dump file at path, each row once, the rows coming
// from fill; it returns how many were written. On an error no file is left.
func WriteDump(path string, opt DumpOptions, fill func(RowWriter) error) (uint64, error) {
	if opt.Format == trace.FormatDB {
		if err := safefs.CheckReserve(path, 0); err != nil {
			return 0, err
		}
		w, err := trace.CreateSQLite(path)
		if err != nil {
			return 0, err
		}
		if err := fill(&reserveRows{RowWriter: w, path: path}); err != nil {
			w.Abort()
			return 0, err
		}
		for _, t := range opt.PythonTraces {
			if err := w.AddPythonTrace(opt.Pid, t); err != nil {
				w.Abort()
				return 0, fmt.Errorf("cannot write %s: %v", path, err)
			}
		}
		return w.Rows(), w.Close()
	}
	var rows uint64
	err := safefs.WriteDerived(path, func(f io.Writer) error {
		cw := trace.NewCSVWriter(f) // buffers whole: no bufio, no second copy
		if err := fill(cw); err != nil {
			cw.Abort() // (batches under way are not written)
			return err
		}
		rows = cw.Rows()
		return cw.Flush()
	})
	return rows, err
}

// pythonTraces lists the python_trace CSVs of a capture's dump folder.
func pythonTraces(dumpDir string) []string {
	traces, _ := filepath.Glob(filepath.Join(dumpDir, "python_trace_*.csv"))
	return traces
}

// batch is a run of decoded events handed from the decoder to the writer.
// The decoder fills its events in place (Decoder.NextInto): an event is
// 264 bytes, and copying each showed.
type batch struct {
	events []trace.Event
	err    error
}

const batchSize = 4096

// decodeBatches runs next on its own goroutine, so decoding the spool and
// formatting the dump use both cores; pre (if not nil) sees each event
// there too, then keep (if not nil) says whether it goes in a batch (an
// event is looked at while it is in this core's cache). The channel
// closes at the end (or after a batch carrying an error). Batches the
// consumer is done with come back through free.
func decodeBatches(next func(*trace.Event) (*trace.Event, error), pre func(*trace.Event), keep func(*trace.Event) bool, free <-chan []trace.Event) <-chan batch {
	out := make(chan batch, 8)
	go func() {
		defer close(out)
		for {
			var b batch
			select {
			case b.events = <-free:
			default:
				b.events = make([]trace.Event, batchSize)
			}
			n := 0
			for n < batchSize {
				dst := &b.events[n]
				e, err := next(dst)
				if err != nil {
					b.err = err
					break
				}
				if e == nil {
					break
				}
				if e != dst {
					*dst = *e
				}
				if pre != nil {
					pre(dst)
				}
				if keep != nil && !keep(dst) {
					continue // (its place is reused)
				}
				n++
			}
			b.events = b.events[:n]
			if n > 0 || b.err != nil {
				out <- b
			}
			if b.err != nil || n < batchSize {
				return
			}
		}
	}()
	return out
}

// eachEvent hands f every event next decodes (on another goroutine), in
// order, until the end or an error; pre (if not nil) sees each event first,
// on the decoding goroutine, to share the work between the two. Neither
// may keep e after it returns.
func eachEvent(next func(*trace.Event) (*trace.Event, error), pre func(*trace.Event), f func(*trace.Event) error) error {
	free := make(chan []trace.Event, 10)
	batches := decodeBatches(next, pre, nil, free)
	defer func() {
		for range batches { // let the decoder finish if f stopped early
		}
	}()
	for b := range batches {
		if b.err != nil {
			return b.err
		}
		for i := range b.events {
			if err := f(&b.events[i]); err != nil {
				return err
			}
		}
		select {
		case free <- b.events[:batchSize]:
		default:
		}
	}
	return nil
}

// batchWriter is a RowWriter that takes whole batches and formats them on
// goroutines of its own (trace.CSVWriter); release says when the events may
// be reused.
type batchWriter interface {
	WriteBatch(evs []trace.Event, release func()) error
}

// writeEvents writes to w every event next decodes that keep passes (keep
// may annotate it); pre as in eachEvent, keep after it, in order. A
// batchWriter gets whole batches, keep running on the decoding goroutine;
// another writer gets each event on the calling goroutine. (A write error
// is seen a few batches late: the batches under way are decoded first.)
func writeEvents(next func(*trace.Event) (*trace.Event, error), pre func(*trace.Event), keep func(*trace.Event) bool, w RowWriter) error {
	bw, ok := w.(batchWriter)
	if !ok {
		return eachEvent(next, pre, func(e *trace.Event) error {
			if !keep(e) {
				return nil
			}
			return w.Write(e)
		})
	}
	free := make(chan []trace.Event, 16)
	batches := decodeBatches(next, pre, keep, free)
	defer func() {
		for range batches { // let the decoder finish after an error
		}
	}()
	for b := range batches {
		if b.err != nil {
			return b.err
		}
		whole := b.events[:batchSize]
		if err := bw.WriteBatch(b.events, func() {
			select {
			case free <- whole:
			default:
			}
		}); err != nil {
			return err
		}
	}
	return nil
}

// reserveRows stops a DB dump when the disk's reserve would be crossed
// (safefs.Reserve): it looks at the free space every reserveRowsEvery rows.
type reserveRows struct {
	RowWriter
	path string
	n    int
}

const reserveRowsEvery = 100_000

func (r *reserveRows) Write(e *trace.Event) error {
	if r.n++; r.n%reserveRowsEvery == 0 {
		if err := safefs.CheckReserve(r.path, 32<<20); err != nil { // room for the rows until the next look
			return err
		}
	}
	return r.RowWriter.Write(e)
}
