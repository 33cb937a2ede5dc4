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

// decodeBatches runs next on its own goroutine and pre and keep on a
// second one, batch by batch in order, so that decoding the spool, feeding
// the analyses and formatting the dump spread over the cores (the decoder
// alone is the longest of them, and on two cores the scheduler balances the
// other two against it). pre (if not nil) sees every event, then keep (if
// not nil) says whether it stays in its batch. The channel closes at the
// end (or after a batch carrying an error). Batches the consumer is done
// with come back through free.
func decodeBatches(next func(*trace.Event) (*trace.Event, error), pre func(*trace.Event), keep func(*trace.Event) bool, free chan []trace.Event) <-chan batch {
	decoded := make(chan batch, 4)
	go func() {
		defer close(decoded)
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
				n++
			}
			b.events = b.events[:n]
			if n > 0 || b.err != nil {
				decoded <- b
			}
			if b.err != nil || n < batchSize {
				return
			}
		}
	}()
	if pre == nil && keep == nil {
		return decoded
	}
	out := make(chan batch, 4)
	go func() {
		defer close(out)
		for b := range decoded {
			n := 0
			for i := range b.events {
				e := &b.events[i]
				if pre != nil {
					pre(e)
				}
				if keep != nil && !keep(e) {
					continue
				}
				if n != i {
					b.events[n] = *e
				}
				n++
			}
			b.events = b.events[:n]
			if n > 0 || b.err != nil {
				out <- b
			} else if cap(b.events) >= batchSize {
				// (a batch whose events all stayed out: its place is reused)
				b.events = b.events[:batchSize]
				select {
				case free <- b.events:
				default:
				}
			}
		}
	}()
	return out
}

// eachBatch hands f each batch of events next decodes (on another
// goroutine), in order, until the end or an error; pre (if not nil) sees
// each event first and keep (if not nil) then decides whether it goes in
// the batch, both on a goroutine between the decoder's and f's. f calls
// release once the batch's events may be reused (it may do so later, from
// elsewhere).
func eachBatch(next func(*trace.Event) (*trace.Event, error), pre func(*trace.Event), keep func(*trace.Event) bool, f func(evs []trace.Event, release func()) error) error {
	free := make(chan []trace.Event, 16)
	batches := decodeBatches(next, pre, keep, free)
	defer func() {
		for range batches { // let the decoder finish if f stopped early
		}
	}()
	for b := range batches {
		if b.err != nil {
			return b.err
		}
		whole := b.events[:batchSize]
		if err := f(b.events, func() {
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

// eachEvent is eachBatch handing f the events one by one. Neither pre nor
// f may keep e after it returns.
func eachEvent(next func(*trace.Event) (*trace.Event, error), pre func(*trace.Event), keep func(*trace.Event) bool, f func(*trace.Event) error) error {
	return eachBatch(next, pre, keep, func(evs []trace.Event, release func()) error {
		defer release()
		for i := range evs {
			if err := f(&evs[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// batchWriter is a RowWriter that takes whole batches and formats them on
// goroutines of its own (trace.CSVWriter); release says when the events may
// be reused.
type batchWriter interface {
	WriteBatch(evs []trace.Event, release func()) error
}

// writeEvents writes to w every event next decodes that keep passes (keep
// may annotate it), pre and keep as in eachBatch. A batchWriter gets whole
// batches. (A write error is seen a few batches late: the batches under
// way are decoded first.)
func writeEvents(next func(*trace.Event) (*trace.Event, error), pre func(*trace.Event), keep func(*trace.Event) bool, w RowWriter) error {
	if bw, ok := w.(batchWriter); ok {
		return eachBatch(next, pre, keep, bw.WriteBatch)
	}
	return eachEvent(next, pre, keep, w.Write)
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
