package collect

import (
	"fmt"
	"os"
	"reflect"
	"syscall"
	"testing"

	"msmemscope/analyzer"
	"msmemscope/analyzer/spec"
	"msmemscope/capture"
	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/spool"
)

// torchSpool writes a capture of n PyTorch-like operators: each allocates
// a block its next operators read; most blocks are freed two operators
// later, some later still (late_deallocation), a few never.
func torchSpool(t *testing.T, n int) string {
	t.Helper()
	cfg := config.Default()
	cfg.Output = t.TempDir()
	cfg.Events.Access, cfg.Events.Launch = true, true
	p, err := capture.Begin(cfg, 4242, "")
	if err != nil {
		t.Fatal(err)
	}
	tick := uint64(1_000_000)
	var body []byte
	rec := func(kind uint16, a, b uint64, text string) {
		tick += 10
		if text != "" {
			b = uint64(len(text))
		}
		body = spool.AppendRec(body, &spool.Rec{TS: tick, A: a, B: b, Kind: kind, Payload: []byte(text), Flags: format.FHost})
	}
	line := func(rw string, p uint64) string { return fmt.Sprintf("\n%s %x %x 4096 float32 32x32 ND", rw, p, p) }
	var prev, prev2 uint64
	for i := 0; i < n; i++ {
		ptr := 0x100000 + uint64(i)*4096
		rd := ""
		if prev != 0 {
			rd = line("R", prev)
		}
		if prev2 != 0 && i%7 == 0 {
			rd += line("R", prev2)
		}
		rec(format.ROpStart, uint64(i+1), 0, "aten::add"+rd)
		rec(format.RMalloc, ptr, 4096, "")
		rec(format.ROpEnd, uint64(i+1), 0, "aten::add"+line("W", ptr))
		if prev2 != 0 && i%5 != 0 {
			rec(format.RFree, prev2, 0, "")
		}
		prev2, prev = prev, ptr
	}
	if _, err := syscall.Write(p.SpoolFD(), append(calibRec(1_000_000, 1), chunk(7, body)...)); err != nil {
		t.Fatal(err)
	}
	p.End(0, 0)
	return p.Dir
}

// The conversion writes the inefficient analysis's results with the rows:
// the dump is the one that writing it plainly and then running
// check_inefficient on it gives, and the report is the same.
func TestConvertInefficientWritesRowsOnce(t *testing.T) {
	dir := torchSpool(t, 3000)
	meta, err := spool.ReadMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"csv", "db"} {
		cfg := meta.Config
		cfg.DataFormat = format
		cfg.Analysis = []string{"inefficient", "decompose"}
		got, err := Convert(dir, Options{Config: &cfg})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Analysis = []string{"decompose"}
		plain, err := Convert(dir, Options{Config: &cfg})
		if err != nil {
			t.Fatal(err)
		}
		want, err := analyzer.CheckInefficient(plain.DumpPath, analyzer.IneffOptions{IdleThreshold: spec.DefaultIdleThreshold}, nil)
		if err != nil || want.Added == 0 {
			t.Fatalf("%s: check_inefficient: %+v, %v", format, want, err)
		}
		a, b := readDump(t, got.DumpPath), readDump(t, plain.DumpPath)
		if len(a) < 3000*4 || !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: the dump differs from write-then-check_inefficient's (%d and %d rows)", format, len(a), len(b))
		}
		r := got.Inefficient
		r.Input, want.Input = "", ""
		if !reflect.DeepEqual(r, want) {
			t.Fatalf("%s: reports differ:\n%+v\n%+v", format, r, want)
		}
		if !reflect.DeepEqual(got.Decompose, plain.Decompose) {
			t.Fatalf("%s: decompose reports differ", format)
		}
		os.Remove(got.DumpPath)
		os.Remove(plain.DumpPath)
	}
}
