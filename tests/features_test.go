package tests

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"msmemscope/format"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"msmemscope/analyzer"
	"msmemscope/internal/spooltest"
	"msmemscope/spool"
	"msmemscope/trace"
)

// row is a compact description of a dump row for exact comparisons.
func row(e *trace.Event) string {
	switch e.Kind {
	case trace.KindMalloc:
		s := fmt.Sprintf("MALLOC %s %d", e.Type, e.Size)
		if e.Shadow {
			s += " shadow"
		}
		return s
	case trace.KindFree:
		return fmt.Sprintf("FREE %s %d", e.Type, e.Size)
	case trace.KindMstx:
		return fmt.Sprintf("MSTX %s %s", e.Type, e.Name)
	}
	return e.Kind.String() + " " + e.Type
}

func rows(evs []*trace.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, row(e))
	}
	return out
}

func sameRows(t *testing.T, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("rows:\n got  %q\n want %q", got, want)
	}
}

// TestMstxSteps: mstx ranges named "step start" are steps 1..4 (SPEC §3):
// the block step k allocates (10000+k bytes) is in step k, the ones before
// the first and after the last range are in step 0; the Range_start and
// Range_end rows carry the message and the same id; the mark is recorded.
func TestMstxSteps(t *testing.T) {
	bin := compile(t, "steps.c", "", linkMemscope()...)
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	mp := readManifest(t, out).main(t)
	evs := readDump(t, mp.Dump)
	sameRows(t, rows(evs), []string{
		"SYSTEM START",
		"MALLOC HOST 9000", "FREE HOST 9000",
		"MSTX Range_start step start", "MSTX Mark inside step 1", "MALLOC HOST 10001", "FREE HOST 10001", "MSTX Range_end step start",
		"MSTX Range_start step start", "MALLOC HOST 10002", "FREE HOST 10002", "MSTX Range_end step start",
		"MSTX Range_start step start", "MALLOC HOST 10003", "FREE HOST 10003", "MALLOC HOST 20003", "MSTX Range_end step start",
		"MSTX Range_start step start", "MALLOC HOST 10004", "FREE HOST 10004", "MSTX Range_end step start",
		"MALLOC HOST 9999", "FREE HOST 9999",
		"SYSTEM PROCESS_EXIT",
	})
	open := map[uint64]int{}
	for _, e := range evs {
		switch {
		case e.Kind == trace.KindMalloc && e.Size > 10000 && e.Size <= 10004:
			if e.Step != int(e.Size-10000) {
				t.Errorf("block %d is in step %d, want %d", e.Size, e.Step, e.Size-10000)
			}
		case e.Kind == trace.KindMalloc && e.Size == 20003:
			if e.Step != 3 {
				t.Errorf("block 20003 is in step %d, want 3", e.Step)
			}
		case e.Kind == trace.KindMalloc && (e.Size == 9000 || e.Size == 9999):
			if e.Step != 0 {
				t.Errorf("block %d (outside every range) is in step %d, want 0", e.Size, e.Step)
			}
		case e.Kind == trace.KindMstx && e.Type == trace.TypeRangeStart:
			open[e.MstxID] = e.Step
		case e.Kind == trace.KindMstx && e.Type == trace.TypeRangeEnd:
			s, ok := open[e.MstxID]
			if !ok || s != e.Step {
				t.Errorf("Range_end id %d (step %d) closes no open range of its step", e.MstxID, e.Step)
			}
			delete(open, e.MstxID)
		}
	}
}

// TestStepsFilter: --steps=2 writes only step 2's rows plus SYSTEM rows, while
// the leak analysis still sees every event (the block kept from step 3).
func TestStepsFilter(t *testing.T) {
	bin := compile(t, "steps.c", "", linkMemscope()...)
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--steps=2", bin)
	mp := readManifest(t, out).main(t)
	var evs []*trace.Event
	scanDump(t, mp.Dump, false, func(e *trace.Event) { evs = append(evs, e) })
	sameRows(t, rows(evs), []string{
		"SYSTEM START",
		"MSTX Range_start step start", "MALLOC HOST 10002", "FREE HOST 10002", "MSTX Range_end step start",
		"SYSTEM PROCESS_EXIT",
	})
	rep := readLeaks(t, mp.Folder)
	var exitBytes uint64
	for _, l := range rep {
		if l.kind == "EXIT" {
			exitBytes += l.size
		}
	}
	if exitBytes != 20003 {
		t.Errorf("with --steps=2 the leak report's exit leaks total %d bytes, want 20003 (the block kept in step 3)", exitBytes)
	}
	// A step the run never began is said (it wrote nothing of it, as an
	// empty step: a mistyped id read as one).
	r := mustRun(t, 0, filepath.Join(t.TempDir(), "out"), "--steps=2,9", bin)
	if n := strings.Count(r.Stderr, "--steps: step 9 never began"); n != 1 {
		t.Errorf("step 9 said %d times, want once:\n%s", n, r.Stderr)
	}
	if r := mustRun(t, 0, filepath.Join(t.TempDir(), "out"), "--steps=2", bin); strings.Contains(r.Stderr, "never began") {
		t.Errorf("a step that began said as never begun:\n%s", r.Stderr)
	}
}

// TestOwnMappingsInvisible: an anonymous mmap/munmap of the program is a
// MALLOC and a FREE of type MMAP; one made from inside libmemscope (the Go
// runtime's, through cgo's x_cgo_mmap) is not recorded at all.
func TestOwnMappingsInvisible(t *testing.T) {
	bin := compile(t, "ownmmap.c", "", "-ldl")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	mp := readManifest(t, out).main(t)
	var evs []*trace.Event
	scanDump(t, mp.Dump, false, func(e *trace.Event) {
		if e.Type == trace.TypeMmap {
			evs = append(evs, e)
		}
	})
	sameRows(t, rows(evs), []string{"MALLOC MMAP 262144", "FREE MMAP 262144"})
}

// TestDeferredStartStop: --collect-mode=deferred with msmemscope_start() and
// msmemscope_stop(): nothing before the first start, memory rows only inside
// start/stop ranges, and a block allocated while stopped and freed while
// started is a shadow MALLOC right before its FREE, same allocation_id.
// TestDeferredThreadsOff: two threads allocate and free while collection is
// off (precise stamps on, since both record): none of it is a row.
func TestDeferredThreadsOff(t *testing.T) {
	bin := compile(t, "deferredthreads.c", "", append(linkMemscope(), "-pthread")...)
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--collect-mode=deferred", bin)
	mp := readManifest(t, out).main(t)
	sameRows(t, rows(readDump(t, mp.Dump)), []string{"SYSTEM START", "MALLOC HOST 30002", "SYSTEM STOP", "SYSTEM PROCESS_EXIT"})
	orderSettled(t, mp.Folder)
}

func TestDeferredStartStop(t *testing.T) {
	bin := compile(t, "deferred.c", "", linkMemscope()...)
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--collect-mode=deferred", bin)
	mp := readManifest(t, out).main(t)
	evs := readDump(t, mp.Dump)
	sameRows(t, rows(evs), []string{
		"SYSTEM START",
		"MALLOC HOST 30002", "FREE HOST 30002",
		"MALLOC HOST 30001 shadow", "FREE HOST 30001",
		"SYSTEM STOP",
		"SYSTEM START",
		"MALLOC HOST 30003 shadow", "FREE HOST 30003",
		"MALLOC HOST 30005",
		"MALLOC HOST 30007",
		"SYSTEM STOP",
		"FREE HOST 30007",
		"SYSTEM PROCESS_EXIT",
	})
	on := false
	inRange := map[uint64]bool{} // allocation ids of MALLOC rows inside a range
	for i, e := range evs {
		switch {
		case e.Kind == trace.KindSystem && e.Type == trace.TypeStart:
			on = true
		case e.Kind == trace.KindSystem && e.Type == trace.TypeStop:
			on = false
		case e.Kind == trace.KindFree && !on && inRange[e.AllocID]:
			// the FREE of a block allocated in a range: its pair
		case e.IsMemory() && !on:
			t.Errorf("row %d (%s) is outside every start/stop range", e.ID, row(e))
		}
		if e.Kind == trace.KindMalloc && on {
			inRange[e.AllocID] = true
		}
		if e.Kind == trace.KindMalloc && e.Shadow {
			if i+1 >= len(evs) {
				t.Fatalf("shadow MALLOC row %d is the last row", e.ID)
			}
			f := evs[i+1]
			if f.Kind != trace.KindFree || f.AllocID != e.AllocID || f.Ptr != e.Ptr || f.Size != e.Size || f.Timestamp < e.Timestamp {
				t.Errorf("shadow MALLOC row %d (id %d) is not followed by its FREE: next row %s id %d", e.ID, e.AllocID, row(f), f.AllocID)
			}
		}
	}
	// The ordinary blocks keep distinct allocation ids.
	ids := map[uint64]bool{}
	for _, e := range evs {
		if e.Kind == trace.KindMalloc {
			if ids[e.AllocID] {
				t.Errorf("allocation_id %d used twice", e.AllocID)
			}
			ids[e.AllocID] = true
		}
	}
}

// TestCallStackFileLine: --call-stack=c:8 on a -g program names the function,
// file and exact line of the allocation as the innermost frame, then its
// callers; c:1 keeps one frame.
func TestCallStackFileLine(t *testing.T) {
	src := filepath.Join(progsDir, "callstack.c")
	bin := compile(t, src, "")
	want := []string{
		fmt.Sprintf("make_block callstack.c:%d (callstack)", sourceLine(t, src, "ALLOC_SITE")),
		fmt.Sprintf("middle callstack.c:%d (callstack)", sourceLine(t, src, "MIDDLE_SITE")),
		fmt.Sprintf("main callstack.c:%d (callstack)", sourceLine(t, src, "MAIN_SITE")),
	}
	for _, depth := range []int{8, 1} {
		out := filepath.Join(t.TempDir(), "out")
		mustRun(t, 0, out, "--call-stack=c:"+strconv.Itoa(depth), bin)
		evs := readDump(t, readManifest(t, out).main(t).Dump)
		var stack string
		for _, e := range evs {
			if e.Kind == trace.KindMalloc && e.Size == 4321 {
				stack = e.CStack
			}
		}
		fs := frames(stack)
		if len(fs) == 0 || len(fs) > depth {
			t.Errorf("c:%d: the 4321-byte block has %d frames: %q", depth, len(fs), stack)
			continue
		}
		n := min(len(want), depth)
		if len(fs) < n || !slices.Equal(fs[:n], want[:n]) {
			t.Errorf("c:%d: stack %q, want it to begin %q", depth, stack, want[:n])
		}
	}
}

// TestCallStackCxxNew: a C++ new call site is found: the innermost frame is
// the user function calling new (at its line), not operator new.
func TestCallStackCxxNew(t *testing.T) {
	src := filepath.Join(progsDir, "newsite.cpp")
	bin := compile(t, src, "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--call-stack=c:8", bin)
	evs := readDump(t, readManifest(t, out).main(t).Dump)
	var stack string
	for _, e := range evs {
		if e.Kind == trace.KindMalloc && e.Size == 4444 {
			stack = e.CStack
		}
	}
	fs := frames(stack)
	want := []string{
		fmt.Sprintf("build_object newsite.cpp:%d (newsite)", sourceLine(t, src, "NEW_SITE")),
		fmt.Sprintf("main newsite.cpp:%d (newsite)", sourceLine(t, src, "MAIN_SITE")),
	}
	if len(fs) < 2 || !slices.Equal(fs[:2], want) {
		t.Errorf("stack of new Obj: %q, want it to begin %q", stack, want)
	}
}

// TestCallStackWithoutFramePointers: a program built with -O2 and no frame
// pointers: its functions keep none, so the stack is unwound with their CFI
// and reads as valgrind's (it was leaf and then a false caller).
func TestCallStackWithoutFramePointers(t *testing.T) {
	src := filepath.Join(progsDir, "nofp.c")
	bin := compile(t, src, "O2", "-O2", "-fomit-frame-pointer")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--call-stack=c:8", bin)
	stackBegins(t, out, 4323, src, "nofp", [][2]string{{"leaf", "LEAF"}, {"mid", "MID"}, {"top", "TOP"}, {"main", "MAIN"}})
	// A function without a frame pointer between two with: the walk goes
	// on from it with its CFI (it went from work to main, top lost).
	src = filepath.Join(progsDir, "fpmix.c")
	bin = compile(t, src, "O2", "-O2", "-fno-omit-frame-pointer")
	out = filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--call-stack=c:8", bin)
	stackBegins(t, out, 4001, src, "fpmix", [][2]string{{"use", "USE"}, {"work", "WORK"}, {"top", "TOP"}, {"main", "MAIN"}})
	// apply keeps no frame pointer and a count in rbp across its call: the
	// walk goes on from it with its CFI (it ended at apply).
	stackBegins(t, out, 4103, src, "fpmix", [][2]string{{"cb", "CB"}, {"apply", "APPLY"}, {"top2", "T2"}, {"main", "M2"}})
}

// stackBegins checks that the C stack of the block of size bytes in out's
// capture begins with the frames named: a function of src (module mod) and
// the marker of its line.
func stackBegins(t *testing.T, out string, size uint64, src, mod string, fns [][2]string) {
	t.Helper()
	var stack string
	for _, e := range readDump(t, readManifest(t, out).main(t).Dump) {
		if e.Kind == trace.KindMalloc && e.Size == size {
			stack = e.CStack
		}
	}
	var want []string
	for _, f := range fns {
		want = append(want, fmt.Sprintf("%s %s:%d (%s)", f[0], filepath.Base(src), sourceLine(t, src, f[1]), mod))
	}
	if fs := frames(stack); len(fs) < len(want) || !slices.Equal(fs[:len(want)], want) {
		t.Errorf("stack of the %d-byte block: %q, want it to begin %q", size, stack, want)
	}
}

// TestStacksLeaveFreesCompact: with stacks wanted, FREEs keep the compact
// path (MALLOCs take the general one, which takes the stacks); the gate's
// mark that stacks are wanted is never written into a FREE record (its
// reader would take the record as carrying a stack).
func TestStacksLeaveFreesCompact(t *testing.T) {
	bin := compile(t, "farfree.c", "")
	for _, opt := range []string{"--call-stack=c:4", "--call-stack=c:4,python:4"} {
		out := filepath.Join(t.TempDir(), "out")
		mustRun(t, 0, out, opt, bin)
		sp, err := spool.OpenFile(filepath.Join(readManifest(t, out).main(t).Folder, "spool", spool.FileName))
		if err != nil {
			t.Fatal(err)
		}
		frees, stacked := 0, 0
		spooltest.Each(t, sp, func(r *spool.Rec, _ uint64) {
			if r.Kind != format.RFree || r.Flags&format.FSubMask != format.FHost {
				return
			}
			frees++
			if r.Flags&(format.FCStack|format.FPyStack) != 0 {
				stacked++
			}
		})
		sp.Close()
		if frees < 100 || stacked != 0 {
			t.Errorf("%s: %d HOST FREEs, %d of them flagged with a stack", opt, frees, stacked)
		}
	}
}

// TestLateLoadedCxx: a C program that loads a C++ library with dlopen after
// start-up (as Python loads torch: libstdc++ comes with it) and has it
// allocate with new. operator new is still the allocator's entry point: the
// block's C stack begins at the C++ caller (walked through libstdc++ with
// its unwind tables, not frame pointers it lacks), and its live-report site
// is that caller, with C stacks (each stack written once, named by id) and
// without any (the allocator's caller through the wrapper).
func TestLateLoadedCxx(t *testing.T) {
	lsrc, msrc := filepath.Join(progsDir, "latecxx_lib.cpp"), filepath.Join(progsDir, "latecxx.c")
	lib := compile(t, lsrc, "", "-shared", "-fPIC")
	bin := compile(t, msrc, "", append(linkMemscope(), "-ldl")...)
	newAt := fmt.Sprintf("latecxx_lib.cpp:%d", sourceLine(t, lsrc, "LATE_NEW"))
	want := []string{
		"build_late " + newAt + " (latecxx_lib.so)",
		fmt.Sprintf("make_object latecxx_lib.cpp:%d (latecxx_lib.so)", sourceLine(t, lsrc, "LATE_CALL")),
		fmt.Sprintf("main latecxx.c:%d (latecxx)", sourceLine(t, msrc, "MAIN_CALL")),
	}
	for _, opts := range [][]string{{"--call-stack=c:8"}, nil} {
		out := filepath.Join(t.TempDir(), "out")
		r := mustRun(t, 0, out, append(opts, bin, lib)...)
		var rep struct {
			Result struct {
				Report []struct {
					Site     string `json:"site"`
					Function string `json:"function"`
					Size     uint64 `json:"size"`
				} `json:"mem_report"`
			} `json:"result"`
		}
		line, _, _ := strings.Cut(r.Stdout, "\n")
		if err := json.Unmarshal([]byte(line), &rep); err != nil {
			t.Fatalf("%v: the live report %q: %v", opts, line, err)
		}
		found := false
		for _, s := range rep.Result.Report {
			if s.Size == 4444 {
				found = s.Site == newAt && s.Function == "build_late"
				if !found {
					t.Errorf("%v: the new Obj's site %s (%s), want %s (build_late)", opts, s.Site, s.Function, newAt)
				}
			}
		}
		if !found {
			t.Errorf("%v: live report %+v: no 4444-byte block at build_late", opts, rep.Result.Report)
		}
		if opts == nil {
			continue
		}
		var stack string
		for _, e := range readDump(t, readManifest(t, out).main(t).Dump) {
			if e.Kind == trace.KindMalloc && e.Size == 4444 {
				stack = e.CStack
			}
		}
		if fs := frames(stack); len(fs) < len(want) || !slices.Equal(fs[:len(want)], want) {
			t.Errorf("stack of new Obj: %q, want it to begin %q", stack, want)
		}
	}
}

// leakRow is one row of analysis/leaks_*.csv.
type leakRow struct {
	kind, step, stack string
	size              uint64
	blocks            int
	typ               string
	leakKind          string // Kind: definitely_lost, ..., N/A
}

// readLeaks reads the one leak report of a process folder.
func readLeaks(t *testing.T, folder string) []leakRow {
	t.Helper()
	path := onlyFile(t, filepath.Join(folder, "analysis", "leaks_*.csv"))
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(recs) == 0 || !slices.Equal(recs[0], analyzer.LeakCSVHeader) {
		t.Fatalf("%s: header %q, want %q", path, recs, analyzer.LeakCSVHeader)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	var out []leakRow
	for _, r := range recs[1:] {
		size, err1 := strconv.ParseUint(r[col["Size(byte)"]], 10, 64)
		blocks, err2 := strconv.Atoi(r[col["Blocks"]])
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: bad row %q", path, r)
		}
		out = append(out, leakRow{kind: r[col["Leak"]], leakKind: r[col["Kind"]], step: r[col["Step"]], stack: r[col["Call Stack(C)"]],
			size: size, blocks: blocks, typ: r[col["Event Type"]]})
	}
	return out
}

// TestLeakReportDemo: examples/leak_demo.c leaks one 1008-byte node per step
// from step 2 on in remember_batch. Step leaks are reported exactly for steps
// 2, 3 and 4 (step 5's block is never alive one full step later), at
// remember_batch's malloc line; exit leaks are grouped by call stack, largest
// first, the remember_batch group holding the 4 nodes; the report's exit
// totals equal the dump's blocks in use at exit; the console names the site.
func TestLeakReportDemo(t *testing.T) {
	src := filepath.Join(repoRoot, "examples", "leak_demo.c")
	bin := compile(t, src, "", append([]string{"-fno-omit-frame-pointer"}, linkMemscope()...)...)
	out := filepath.Join(t.TempDir(), "out")
	r := mustRun(t, 0, out, "--call-stack=c:8", bin)
	if !strings.Contains(r.Stdout, "trained 5 steps") {
		t.Errorf("demo stdout %q", r.Stdout)
	}
	mp := readManifest(t, out).main(t)
	site := fmt.Sprintf("remember_batch leak_demo.c:%d (leak_demo)", sourceLine(t, src, "leaks: history is never freed"))
	if !strings.Contains(r.Stderr, site) {
		t.Errorf("the console summary does not name %q:\n%s", site, r.Stderr)
	}
	rep := readLeaks(t, mp.Folder)
	var steps []string
	var exit []leakRow
	for _, l := range rep {
		switch l.kind {
		case "STEP":
			steps = append(steps, l.step)
			if l.size != 1008 || l.blocks != 1 || l.typ != "HOST" || frames(l.stack)[0] != site {
				t.Errorf("step %s leak: %d bytes in %d blocks (%s) at %q; want 1008 bytes, 1 HOST block at %s",
					l.step, l.size, l.blocks, l.typ, l.stack, site)
			}
		case "EXIT":
			exit = append(exit, l)
		default:
			t.Errorf("unknown leak kind %q", l.kind)
		}
	}
	if !slices.Equal(steps, []string{"2", "3", "4"}) {
		t.Errorf("step leaks in steps %q, want exactly 2, 3, 4", steps)
	}
	var groups int
	var exitBytes uint64
	var exitBlocks int
	stacks := map[string]bool{}
	for i, g := range exit {
		if i > 0 && g.size > exit[i-1].size {
			t.Errorf("exit leak groups are not largest first: %d bytes after %d", g.size, exit[i-1].size)
		}
		if stacks[g.stack] {
			t.Errorf("two exit leak groups share the stack %q", g.stack)
		}
		stacks[g.stack] = true
		exitBytes += g.size
		exitBlocks += g.blocks
		if frames(g.stack)[0] == site {
			groups++
			if g.size != 4*1008 || g.blocks != 4 {
				t.Errorf("remember_batch exit group: %d bytes in %d blocks, want 4032 in 4", g.size, g.blocks)
			}
		}
	}
	if groups != 1 {
		t.Errorf("%d exit leak groups at %s, want 1", groups, site)
	}
	h := hostTotals(t, readDump(t, mp.Dump))
	if exitBytes != h.InUseBytes || uint64(exitBlocks) != h.InUseBlocks {
		t.Errorf("exit leaks %d bytes in %d blocks; the dump has %d bytes in %d blocks in use at exit",
			exitBytes, exitBlocks, h.InUseBytes, h.InUseBlocks)
	}
}

// TestThreadExitKeepsOrder: 200 short threads each free their last block in
// a thread-specific key's destructor, which runs after msmemscope's own (the
// thread then records into a ring it takes anew, same tid). Every block is
// a MALLOC then a FREE of the same thread, in that order: none is left
// alive at exit and no FREE is dropped.
func TestThreadExitKeepsOrder(t *testing.T) {
	const threads, size = 200, 4242
	bin := compile(t, "tsdfree.c", "", "-pthread")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	mp := readManifest(t, out).main(t)
	mallocs, frees := map[uint64]int64{}, 0
	scanDump(t, mp.Dump, true, func(e *trace.Event) {
		if e.Type != trace.TypeHost || e.Size != size {
			return
		}
		switch e.Kind {
		case trace.KindMalloc:
			mallocs[e.AllocID] = e.Tid
		case trace.KindFree:
			if tid, ok := mallocs[e.AllocID]; !ok || tid != e.Tid {
				t.Errorf("row %d: FREE of allocation_id %d by thread %d, allocated by %d (seen %v)", e.ID, e.AllocID, e.Tid, tid, ok)
			}
			frees++
		}
	})
	if len(mallocs) != threads || frees != threads {
		t.Errorf("%d MALLOC and %d FREE rows of %d bytes, want %d each", len(mallocs), frees, size, threads)
	}
}

// TestThreadEndTakesNoOtherRing: a thread that records after its end (a
// key destructor's free) while the ring it gave up was released and then
// taken and given up by another thread: its FREE must say its own thread, not
// the ring's new owner (tsdreuse.c sets the timing up; CI saw it by chance).
func TestThreadEndTakesNoOtherRing(t *testing.T) {
	bin := compile(t, "tsdreuse.c", "", "-pthread")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	tids := map[string]map[int64]int{} // size, kind -> thread -> rows
	scanDump(t, readManifest(t, out).main(t).Dump, true, func(e *trace.Event) {
		if e.Type == trace.TypeHost && (e.Size == 4343 || e.Size == 3131) {
			k := fmt.Sprintf("%d %s", e.Size, e.Kind)
			if tids[k] == nil {
				tids[k] = map[int64]int{}
			}
			tids[k][e.Tid]++
		}
	})
	one := func(k string, n int) int64 {
		if len(tids[k]) != 1 {
			t.Fatalf("%s rows by threads %v, want %d rows by one thread", k, tids[k], n)
		}
		for tid, got := range tids[k] {
			if got != n {
				t.Errorf("%s: %d rows, want %d", k, got, n)
			}
			return tid
		}
		return 0
	}
	a, b := one("4343 MALLOC", 1), one("3131 MALLOC", 10)
	if got := one("4343 FREE", 1); got != a {
		t.Errorf("thread A's late FREE says thread %d, A is %d (B is %d)", got, a, b)
	}
	if got := one("3131 FREE", 10); got != b {
		t.Errorf("thread B's FREEs say thread %d, B is %d", got, b)
	}
}

// TestExecAtOnce: an image that execs in its first milliseconds, before
// the engine opened its spool, keeps its capture ("ended": "exec", its 11
// MALLOCs): the exec waits for the spool, as a crash does. Before, its
// events stayed in the rings and the run listed one process only.
func TestExecAtOnce(t *testing.T) {
	bin := compile(t, "execnow.c", "")
	for i := 0; i < 3; i++ {
		out := filepath.Join(t.TempDir(), "out")
		mustRun(t, 0, out, bin)
		m := readManifest(t, out)
		if len(m.Processes) != 2 {
			t.Fatalf("run %d: %d processes in the manifest, want 2 (the image before the exec and after)", i, len(m.Processes))
		}
		sizes := map[string]map[uint64]int{}
		for _, p := range m.Processes {
			cfg := readConfig(t, p.Folder)
			n := map[uint64]int{}
			scanDump(t, p.Dump, true, func(e *trace.Event) {
				if e.Kind == trace.KindMalloc && (e.Size == 111 || e.Size == 16 || e.Size == 321) {
					n[e.Size]++
				}
			})
			sizes[cfg.Ended] = n
		}
		if n := sizes[spool.EndedExec]; n[111] != 1 || n[16] != 10 || n[321] != 0 {
			t.Errorf("run %d: the image that exec'd: MALLOCs by size %v (by how each ended: %v), want 111: 1, 16: 10", i, n, sizes)
		}
		if n := sizes[spool.EndedExit]; n[321] != 1 || n[111] != 0 {
			t.Errorf("run %d: the image after the exec: MALLOCs by size %v, want 321: 1", i, n)
		}
	}
}

// TestAnalysesOnEveryInput: the step/exit leaks, decompose and the timeline
// give the same answer on every input that holds one capture: the capture
// folder, its spool/ folder, its spool file, a copy of that spool outside
// the folder, the dump CSV and a DB written from it.
func TestAnalysesOnEveryInput(t *testing.T) {
	src := filepath.Join(repoRoot, "examples", "leak_demo.c")
	bin := compile(t, src, "", append([]string{"-fno-omit-frame-pointer"}, linkMemscope()...)...)
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	mp := readManifest(t, out).main(t)
	spoolFile := filepath.Join(mp.Folder, "spool", "spool.bin")
	b, err := os.ReadFile(spoolFile)
	if err != nil {
		t.Fatal(err)
	}
	lone := filepath.Join(t.TempDir(), "lone.bin")
	if err := os.WriteFile(lone, b, 0o640); err != nil {
		t.Fatal(err)
	}
	mustRun(t, 0, out, "--input="+mp.Dump, "--data-format=db", "--analysis=leaks")
	// (--output given: the DB copy is there)
	db := filepath.Join(out, strings.TrimSuffix(filepath.Base(mp.Dump), ".csv")+".db")
	summary := func(stderr string) []string { // the analyses' console lines, without paths
		var lines []string
		for _, l := range stderrLines(stderr) {
			if strings.HasPrefix(l, " ") {
				// Leak kinds come from the scan at exit, which a dump
				// does not keep: the rest must agree.
				for _, k := range analyzer.LeakKinds {
					l = strings.Replace(l, "  "+strings.ReplaceAll(k, "_", " ")+": ", "  ", 1)
				}
				lines = append(lines, strings.TrimSpace(l))
			}
		}
		return lines
	}
	var wantSummary []string
	var wantTimeline string
	for i, in := range []string{mp.Folder, filepath.Dir(spoolFile), spoolFile, lone, mp.Dump, db} {
		dumps, _ := filepath.Glob(filepath.Join(mp.Folder, "dump", "memscope_dump_*.csv"))
		r := mustRun(t, 0, filepath.Join(t.TempDir(), "o"), "--input="+in, "--analysis=leaks,decompose")
		// The capture folder, its spool/ folder and its spool file convert the capture again.
		after, _ := filepath.Glob(filepath.Join(mp.Folder, "dump", "memscope_dump_*.csv"))
		if converted := len(after) == len(dumps)+1; converted != (i < 3) {
			t.Errorf("--input=%s: %d dumps before, %d after", in, len(dumps), len(after))
		}
		got := summary(r.Stderr)
		if kinds := strings.Contains(r.Stderr, "leak summary: definitely lost: 0 B in 0 blocks, indirectly lost: 0 B in 0 blocks, possibly lost: 0 B in 0 blocks, still reachable: 7.9 KiB in 5 blocks"); kinds != (i < 3) {
			t.Errorf("--input=%s: leak kinds summary %v, want it from a capture only:\n%s", in, kinds, r.Stderr)
		}
		if wantSummary == nil {
			wantSummary = got
			if !slices.ContainsFunc(got, func(l string) bool { return strings.HasPrefix(l, "HOST") && strings.Contains(l, "peak") }) ||
				!slices.ContainsFunc(got, func(l string) bool { return l == "7.9 KiB in 5 blocks  (no stack)" }) {
				t.Fatalf("no decompose or leak summary for the capture:\n%s", r.Stderr)
			}
		} else if !slices.Equal(got, wantSummary) {
			t.Errorf("--input=%s: analyses say\n%q\nthe capture folder gave\n%q", in, got, wantSummary)
		}
		tl := mustRun(t, 0, filepath.Join(t.TempDir(), "o"), "--timeline", "--input="+in)
		peaks, _, _ := strings.Cut(tl.Stdout, "\n\n") // the sites below need the capture's maps to be named
		if wantTimeline == "" {
			wantTimeline = peaks
		} else if peaks != wantTimeline {
			t.Errorf("--timeline --input=%s:\n%s\nthe capture folder gave\n%s", in, peaks, wantTimeline)
		}
	}
}

// TestTimelineOfRotatedLogs: the peak the timeline finds in rotated logs is
// the one it finds in a full capture of the same program (msmemscope's own
// blocks, which the logs keep for pairing, made the logs' peak 5.6 KiB
// higher).
func TestTimelineOfRotatedLogs(t *testing.T) {
	bin := compile(t, filepath.Join(repoRoot, "examples", "leak_demo.c"), "", linkMemscope()...)
	peak := func(mode string) uint64 {
		out := filepath.Join(t.TempDir(), "out")
		mustRun(t, 0, out, "--log-mode="+mode, bin)
		tl := mustRun(t, 0, filepath.Join(t.TempDir(), "o"), "--timeline", "--input="+readManifest(t, out).main(t).Folder)
		peaks, _, _ := strings.Cut(tl.Stdout, "\n\n")
		var top uint64
		for _, l := range strings.Split(peaks, "\n")[1:] {
			f := strings.Fields(l)
			if len(f) == 2 {
				v, _ := strconv.ParseUint(f[1], 10, 64)
				top = max(top, v)
			}
		}
		if top == 0 {
			t.Fatalf("--log-mode=%s: no peak in\n%s", mode, tl.Stdout)
		}
		return top
	}
	if full, rot := peak("full"), peak("rotate"); full != rot {
		t.Errorf("timeline peak: %d B from rotated logs, %d B from a full capture", rot, full)
	}
}

// TestChildLeaksSaid: a program run by another traced one (a shell's
// child) that leaks has its leaks said too, with its name; one that
// leaks nothing says nothing.
func TestChildLeaksSaid(t *testing.T) {
	bin := compile(t, "lk_dlerror.c", "")
	r := mustRun(t, 0, filepath.Join(t.TempDir(), "out"), "sh", "-c", bin+"; /bin/true; true")
	if !strings.Contains(r.Stderr, "(lk_dlerror): leaks:") || !strings.Contains(r.Stderr, "definitely lost: 24 B in 1 block") {
		t.Errorf("no leak summary for the child that leaked:\n%s", r.Stderr)
	}
	if strings.Contains(r.Stderr, "(true): leaks:") {
		t.Errorf("a summary for the child that leaked nothing:\n%s", r.Stderr)
	}
	// --input= on the output folder converts every process of the run,
	// not only the shell (its main process).
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "sh", "-c", bin+"; /bin/true; true")
	m := readManifest(t, out)
	again := runCLI(t, 120*time.Second, "", "--input="+out)
	if got := strings.Count(again.Stderr, " rows (complete) -> "); again.Code != 0 || got != len(m.Processes) || len(m.Processes) < 3 {
		t.Errorf("--input=%s: exit %d, converted %d captures of the run's %d processes:\n%s", out, again.Code, got, len(m.Processes), again.Stderr)
	}
}

// TestLogAloneReportsInItsCapture: a rotated log given alone to --input
// has its leaks report written into its capture's analysis folder, as a
// dump file's is, not into the working folder's default output; the
// console says its blocks alive are so at the log's end, not at exit.
func TestLogAloneReportsInItsCapture(t *testing.T) {
	bin := compile(t, "single.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, "--log-mode=rotate", bin)
	folder := readManifest(t, out).main(t).Folder
	log := onlyFile(t, filepath.Join(folder, "spool", "log_*.zst"))
	cwd := t.TempDir()
	reports := filepath.Join(folder, "analysis", "leaks_*.csv")
	before, _ := filepath.Glob(reports) // the run's own, at exit
	if r := runCLI(t, 60*time.Second, cwd, "--input="+log); r.Code != 0 {
		t.Fatalf("exit %d\n%s", r.Code, r.Stderr)
	} else if !strings.Contains(r.Stderr, "alive at the log's end") || strings.Contains(r.Stderr, "at exit") {
		// (a log read alone ends where the log does, not the run)
		t.Errorf("the console said:\n%s", r.Stderr)
	}
	if after, _ := filepath.Glob(reports); len(after) != len(before)+1 {
		t.Errorf("leaks reports in the capture: %v before, %v after", before, after)
	}
	if ents, _ := os.ReadDir(cwd); len(ents) != 0 {
		t.Errorf("the working folder got %v", ents)
	}
}
