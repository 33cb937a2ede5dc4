package trace

import (
	"errors"
	"runtime"
	"sync"
)

// Batches of rows, formatted on several goroutines and written in order.
// Formatting is most of a conversion's work, and one goroutine formats
// rows more slowly than the decoder makes them: with each batch formatted
// on its own, every core helps, and the file still gets the rows in turn.

// csvJob is one batch on its way: a formatter fills buf, then the writer
// goroutine writes it when the batches before it are written.
type csvJob struct {
	evs     []Event
	buf     []byte
	done    chan struct{} // closed once buf holds the rows
	release func()
}

// csvBatches is a CSVWriter's pipeline while WriteBatch is in use.
type csvBatches struct {
	work  chan *csvJob // to the formatters
	order chan *csvJob // to the writer, in the order of WriteBatch calls
	bufs  chan []byte  // formatted buffers written out, to reuse
	wg    sync.WaitGroup
	mu    sync.Mutex
	err   error // the first write error (or errBatchesAborted)
}

var errBatchesAborted = errors.New("csv: batches aborted")

func (p *csvBatches) error() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *csvBatches) fail(err error) {
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
}

// WriteBatch writes a row for each of evs, as Write would one after the
// other, formatting them on other goroutines; release is called once evs
// may be reused (always, also after an error). Once WriteBatch is used,
// rows are written only with WriteBatch, and Flush (or Abort) must end it.
func (w *CSVWriter) WriteBatch(evs []Event, release func()) error {
	if w.par == nil {
		if w.err == nil && !w.header {
			w.writeHeader()
		}
		if err := w.flushBuf(); err != nil {
			release()
			return err
		}
		w.startBatches()
	}
	if err := w.par.error(); err != nil {
		release()
		return err
	}
	j := &csvJob{evs: evs, release: release, done: make(chan struct{})}
	select {
	case j.buf = <-w.par.bufs:
	default:
	}
	w.rows += uint64(len(evs))
	w.par.order <- j // waits while enough batches are under way
	w.par.work <- j
	return nil
}

// maxFormatters bounds the formatters, and with them the batches under way
// (each about 1 MiB of events and as much text): past a few cores the
// decoder is the slower side anyway.
const maxFormatters = 8

func (w *CSVWriter) startBatches() {
	n := min(runtime.GOMAXPROCS(0), maxFormatters)
	p := &csvBatches{work: make(chan *csvJob, n), order: make(chan *csvJob, 2*n+2), bufs: make(chan []byte, 2*n+4)}
	w.par = p
	for range n {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			f := &CSVWriter{} // its own repeats (ids, stamps, threads, fields)
			for j := range p.work {
				b := j.buf[:0]
				for i := range j.evs {
					b = f.appendRow(b, &j.evs[i])
				}
				j.buf = b
				close(j.done)
			}
		}()
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for j := range p.order {
			<-j.done
			if p.error() == nil {
				if _, err := w.w.Write(j.buf); err != nil {
					p.fail(err)
				}
			}
			j.release()
			if cap(j.buf) <= 4*csvBufSize { // (a huge row's buffer is let go)
				select {
				case p.bufs <- j.buf:
				default:
				}
			}
		}
	}()
}

// endBatches waits for the batches under way; abort: without writing them.
func (w *CSVWriter) endBatches(abort bool) error {
	p := w.par
	if p == nil {
		return nil
	}
	w.par = nil
	if abort {
		p.fail(errBatchesAborted)
	}
	close(p.work)
	close(p.order)
	p.wg.Wait()
	if err := p.error(); err != nil && err != errBatchesAborted {
		w.err = err
	}
	return w.err
}

// Abort ends WriteBatch's work under way without writing more: for a
// caller that stops on an error of its own.
func (w *CSVWriter) Abort() { w.endBatches(true) }
