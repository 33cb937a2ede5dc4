// Command offlinegen writes a synthetic capture for the offline benchmark
// (bench/offline.sh): n events of a PyTorch-like training loop — operator
// launches, PTA allocations with Python stacks, tensor accesses, frees, and
// mstx marks — as a dump CSV and as a SQLite dump, and reports how fast each
// was written.
//
//	offlinegen -n 10000000 -csv cap.csv -db cap.db
//
// The marks "iter" fall at 5%, 50% and 99% of the events, so check_leaks
// reads nearly the whole file; a few blocks leak between the first two and
// a few are inefficient, so both analyses have something to find.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"time"

	"msmemscope/trace"
)

type gen struct {
	n     int
	out   func([]trace.Event) // takes each batch of events
	count int                 // events emitted
	id    uint64
	aid   uint64
	evs   []trace.Event
	sizes map[uint64]uint64
	marks []int // event counts at which to place the marks
}

func (g *gen) add(e trace.Event) {
	g.id++
	e.ID = g.id
	e.Timestamp = 5_000_000_000 + g.id*250
	e.Pid, e.Tid = 4242, 4242
	g.evs = append(g.evs, e)
	g.count++
	if len(g.evs) == cap(g.evs) {
		g.out(g.evs)
		g.evs = g.evs[:0]
	}
}

func (g *gen) malloc(size uint64, inOp bool) uint64 {
	g.aid++
	a := g.aid
	e := trace.Event{Kind: trace.KindMalloc, Type: trace.TypePTA, Device: "host", Ptr: 0x7f0000000000 + a*512, HasPtr: true,
		AllocID: a, Size: size, Owner: "PTA@aten",
		Extra:   []trace.KV{{Key: "total", Value: "268435456"}, {Key: "used", Value: "1048576"}},
		PyStack: "model.py:41(forward);torch/nn/modules/module.py:1501(_call_impl);train.py:88(step);train.py:120(<module>)"}
	if !inOp {
		e.Owner = "PTA@model@weight"
	}
	g.add(e)
	g.sizes[a] = size
	return a
}

func (g *gen) free(a uint64) {
	g.add(trace.Event{Kind: trace.KindFree, Type: trace.TypePTA, Device: "host", Ptr: 0x7f0000000000 + a*512, HasPtr: true,
		AllocID: a, Size: g.sizes[a], Extra: []trace.KV{{Key: "total", Value: "268435456"}, {Key: "used", Value: "1048576"}}})
	delete(g.sizes, a)
}

func (g *gen) access(a uint64, op, typ string) {
	g.add(trace.Event{Kind: trace.KindAccess, Type: typ, Name: op, Device: "host", AllocID: a, Size: g.sizes[a],
		Extra: []trace.KV{{Key: "dtype", Value: "float32"}, {Key: "shape", Value: "[64x256]"}, {Key: "size", Value: "65536"},
			{Key: "format", Value: "N/A"}, {Key: "type", Value: "PTA"}, {Key: "allocation_id", Value: fmt.Sprint(a)}}})
}

var ops = []string{"aten::linear", "aten::relu", "aten::add", "aten::mul", "aten::softmax", "aten::layer_norm"}

// fill generates events until there are g.n. Each step is an operator
// that allocates its output, writes it and reads the previous step's
// output, which is freed right after (outside any operator). One block in
// 1000 is freed only 8 steps later (late_deallocation), one in 5000 never
// (a leak), and one in 1000 is read again 4000 steps later
// (temporary_idleness with the default threshold).
func (g *gen) fill() {
	step := 0
	markAt := 0
	var prev uint64
	type pending struct {
		a    uint64
		step int
	}
	var late, idle []pending
	for g.count < g.n {
		if markAt < len(g.marks) && g.count >= g.marks[markAt] {
			g.add(trace.Event{Kind: trace.KindMstx, Type: trace.TypeMark, Name: "iter", MstxID: uint64(markAt + 1)})
			markAt++
		}
		op := ops[step%len(ops)]
		g.add(trace.Event{Kind: trace.KindOpLaunch, Type: "ATEN_START", Name: op, Device: "host"})
		out := g.malloc(65536+uint64(step%7)*4096, true)
		g.access(out, op, "WRITE")
		if prev != 0 {
			g.access(prev, op, "READ")
		}
		if len(idle) > 0 && step-idle[0].step >= 4000 {
			g.access(idle[0].a, op, "READ")
			late = append(late, pending{idle[0].a, step})
			idle = idle[1:]
		}
		g.add(trace.Event{Kind: trace.KindOpLaunch, Type: "ATEN_END", Name: op, Device: "host"})
		switch {
		case prev == 0:
		case step%5000 == 1: // a leak
		case step%1000 == 1:
			late = append(late, pending{prev, step})
		case step%1000 == 501:
			idle = append(idle, pending{prev, step})
		default:
			g.free(prev)
		}
		for len(late) > 0 && step-late[0].step >= 8 {
			g.free(late[0].a)
			late = late[1:]
		}
		prev = out
		step++
	}
	if extra := g.count - g.n; extra > 0 && extra <= len(g.evs) {
		g.evs = g.evs[:len(g.evs)-extra]
	}
	g.out(g.evs)
	g.evs = g.evs[:0]
}

func main() {
	n := flag.Int("n", 10_000_000, "number of events")
	csvPath := flag.String("csv", "", "dump CSV to write")
	dbPath := flag.String("db", "", "SQLite dump to write")
	flag.Parse()
	var cw *trace.CSVWriter
	var bw *bufio.Writer
	var f *os.File
	var dw *trace.SQLiteWriter
	var err error
	if *csvPath != "" {
		if f, err = os.OpenFile(*csvPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640); err != nil {
			fatal(err)
		}
		bw = bufio.NewWriterSize(f, 1<<20)
		cw = trace.NewCSVWriter(bw)
	}
	var csvTime, dbTime time.Duration
	if *dbPath != "" {
		t0 := time.Now()
		if dw, err = trace.CreateSQLite(*dbPath); err != nil {
			fatal(err)
		}
		dbTime += time.Since(t0)
	}
	rows := 0
	g := &gen{n: *n, sizes: map[uint64]uint64{}, marks: []int{*n / 20, *n / 2, *n * 99 / 100}}
	g.evs = make([]trace.Event, 0, 1<<16)
	g.out = func(evs []trace.Event) {
		rows += len(evs)
		if cw != nil {
			t0 := time.Now()
			for i := range evs {
				if err := cw.Write(&evs[i]); err != nil {
					fatal(err)
				}
			}
			csvTime += time.Since(t0)
		}
		if dw != nil {
			t0 := time.Now()
			for i := range evs {
				if err := dw.Write(&evs[i]); err != nil {
					fatal(err)
				}
			}
			dbTime += time.Since(t0)
		}
	}
	g.add(trace.Event{Kind: trace.KindSystem, Type: trace.TypeStart})
	g.fill()
	if cw != nil {
		t0 := time.Now()
		if err := cw.Flush(); err != nil {
			fatal(err)
		}
		if err := bw.Flush(); err != nil {
			fatal(err)
		}
		if err := f.Close(); err != nil {
			fatal(err)
		}
		csvTime += time.Since(t0)
		fmt.Printf("csv_rows %d\ncsv_seconds %.3f\ncsv_rows_per_s %.0f\n", rows, csvTime.Seconds(), float64(rows)/csvTime.Seconds())
	}
	if dw != nil {
		t0 := time.Now()
		if err := dw.Close(); err != nil {
			fatal(err)
		}
		closeTime := time.Since(t0)
		dbTime += closeTime
		fmt.Printf("db_rows %d\ndb_seconds %.3f\ndb_rows_per_s %.0f\ndb_index_commit_seconds %.3f\n", rows, dbTime.Seconds(), float64(rows)/dbTime.Seconds(), closeTime.Seconds())
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "offlinegen:", err)
	os.Exit(1)
}
