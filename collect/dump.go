package collect

import (
	"bufio"
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
		bw := bufio.NewWriterSize(f, 1<<20)
		cw := trace.NewCSVWriter(bw)
		if err := fill(cw); err != nil {
			return err
		}
		if err := cw.Flush(); err != nil {
			return err
		}
		rows = cw.Rows()
		return bw.Flush()
	})
	return rows, err
}

// pythonTraces lists the python_trace CSVs of a capture's dump folder.
func pythonTraces(dumpDir string) []string {
	traces, _ := filepath.Glob(filepath.Join(dumpDir, "python_trace_*.csv"))
	return traces
}

// batch is a run of decoded events handed from the decoder to the writer.
type batch struct {
	events []*trace.Event
	err    error
}

// decodeBatches runs next on its own goroutine, so decoding the spool and
// formatting the dump use both cores. The channel closes at the end (or
// after a batch carrying an error).
func decodeBatches(next func() (*trace.Event, error)) <-chan batch {
	out := make(chan batch, 8)
	go func() {
		defer close(out)
		const size = 4096
		for {
			b := batch{events: make([]*trace.Event, 0, size)}
			for len(b.events) < size {
				e, err := next()
				if err != nil {
					b.err = err
					break
				}
				if e == nil {
					break
				}
				b.events = append(b.events, e)
			}
			if len(b.events) > 0 || b.err != nil {
				out <- b
			}
			if b.err != nil || len(b.events) < size {
				return
			}
		}
	}()
	return out
}

// eachEvent hands f every event next decodes (on another goroutine), in
// order, until the end or an error.
func eachEvent(next func() (*trace.Event, error), f func(*trace.Event) error) error {
	batches := decodeBatches(next)
	defer func() {
		for range batches { // let the decoder finish if f stopped early
		}
	}()
	for b := range batches {
		if b.err != nil {
			return b.err
		}
		for _, e := range b.events {
			if err := f(e); err != nil {
				return err
			}
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
