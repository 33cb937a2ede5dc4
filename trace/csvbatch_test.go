package trace

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
)

// Batches formatted on several goroutines give the file Write gives, rows
// in order, each batch released once.
func TestWriteBatchAsWrite(t *testing.T) {
	evs := manyEvents(10_000)
	want := writeCSV(t, evs)
	var got bytes.Buffer
	w := NewCSVWriter(&got)
	var released atomic.Int32
	for i := 0; i < len(evs); {
		n := min(1+i%977, len(evs)-i) // batches of many sizes, one empty
		if i == 500 {
			n = 0
		}
		if err := w.WriteBatch(evs[i:i+n], func() { released.Add(1) }); err != nil {
			t.Fatal(err)
		}
		i += n
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("batches wrote %d bytes that differ from Write's %d", got.Len(), len(want))
	}
	if w.Rows() != uint64(len(evs)) {
		t.Fatalf("Rows() = %d, want %d", w.Rows(), len(evs))
	}
	if n := released.Load(); n == 0 {
		t.Fatal("no batch released")
	}
}

type failAfter struct {
	n   int
	err error
}

func (f *failAfter) Write(p []byte) (int, error) {
	if f.n--; f.n < 0 {
		return 0, f.err
	}
	return len(p), nil
}

// A write error stops the batches: WriteBatch or Flush returns it, and
// every batch is released.
func TestWriteBatchError(t *testing.T) {
	full := errors.New("disk full")
	w := NewCSVWriter(&failAfter{n: 3, err: full})
	evs := manyEvents(4096)
	var sent, released atomic.Int32
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		sent.Add(1)
		err = w.WriteBatch(evs, func() { released.Add(1) })
	}
	if ferr := w.Flush(); !errors.Is(err, full) && !errors.Is(ferr, full) {
		t.Fatalf("WriteBatch: %v, Flush: %v; want %v", err, ferr, full)
	}
	if released.Load() != sent.Load() {
		t.Fatalf("%d batches released of %d", released.Load(), sent.Load())
	}
	// Abort after an error of the caller's own ends the goroutines and
	// releases the batches (whether a batch was written by then is open).
	var out bytes.Buffer
	w = NewCSVWriter(&out)
	released.Store(0)
	for range 5 {
		if err := w.WriteBatch(evs, func() { released.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	w.Abort()
	if n := released.Load(); n != 5 {
		t.Fatalf("Abort: %d of 5 batches released", n)
	}
}
