// Package memstats tests SPEC §7 end to end on real programs: the live
// per-site report, the peak timeline and rotating logs.
package memstats

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"msmemscope/analyzer"
	"msmemscope/format"
	"msmemscope/spool"
	"msmemscope/trace"
)

func build(t *testing.T) (cli, libDir string) {
	t.Helper()
	b := os.Getenv("MSMEMSCOPE_BUILD")
	if b == "" {
		b, _ = filepath.Abs("../../build")
	}
	cli, libDir = filepath.Join(b, "bin", "msmemscope"), filepath.Join(b, "lib")
	for _, p := range []string{cli, filepath.Join(libDir, "libmemscope.so")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing: run make build first", p)
		}
	}
	return cli, libDir
}

func compile(t *testing.T, libDir, src string) string {
	t.Helper()
	dir := t.TempDir()
	c := filepath.Join(dir, "prog.c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	inc, _ := filepath.Abs("../../include")
	bin := filepath.Join(dir, "prog")
	out, err := exec.Command("gcc", "-g", "-O0", "-fno-omit-frame-pointer", "-I", inc, "-o", bin, c,
		"-L", libDir, "-lmemscope", "-Wl,-rpath,"+libDir, "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

func run(t *testing.T, cli string, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(cli, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, se.String())
	}
	return so.String(), se.String()
}

const mib = 1 << 20

// grow.c gains 1 MiB every 200 ms at one site; a 3 MiB scratch block from
// another site is freed after the third step. No stdio: the only blocks are
// the planted ones, so every number is exact.
const growProg = `#include <msmemscope.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static void *keep[16];
/* Each report is a reply: {"ok": true, "result": {"total_size": ...}}. */
static __attribute__((noinline)) void grow(int i) { keep[i] = malloc(1 << 20); memset(keep[i], 1, 64); }
static __attribute__((noinline)) void *scratch(void) { return malloc(3 << 20); }
static void say(void) {
	char *r = msmemscope_get_mem_report();
	if (r) { write(1, r, strlen(r)); write(1, "\n", 1); }
	msmemscope_free_string(r);
}
int main(void) {
	usleep(150000);
	void *s = scratch();
	for (int i = 0; i < 5; i++) {
		grow(i);
		usleep(200000);
		if (i == 1) say();
		if (i == 2) free(s);
	}
	say();
	return 0;
}
`

func TestLiveReportAndTimeline(t *testing.T) {
	cli, libDir := build(t)
	prog := compile(t, libDir, growProg)
	out := t.TempDir()
	stdout, _ := run(t, cli, "--output="+out, prog)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 reports, got:\n%s", stdout)
	}
	var replies [2]struct {
		OK     bool
		Result analyzer.MemReport
	}
	for i := range replies {
		if err := json.Unmarshal([]byte(lines[i]), &replies[i]); err != nil || !replies[i].OK {
			t.Fatalf("reply %q: %v", lines[i], err)
		}
	}
	mid, end := replies[0].Result, replies[1].Result
	// Mid-run (after 2 steps): scratch 3 MiB and grow 2 MiB, exactly.
	want := analyzer.MemReport{TotalSize: 5 * mib, Report: []analyzer.SiteSize{
		{Site: "prog.c:8", Function: "scratch", Size: 3 * mib, Count: 1},
		{Site: "prog.c:7", Function: "grow", Size: 2 * mib, Count: 2},
	}}
	if !sameReport(mid, want) {
		t.Errorf("report during the run:\n got %+v\nwant %+v", mid, want)
	}
	want = analyzer.MemReport{TotalSize: 5 * mib, Report: []analyzer.SiteSize{
		{Site: "prog.c:7", Function: "grow", Size: 5 * mib, Count: 5},
	}}
	if !sameReport(end, want) {
		t.Errorf("report at the end:\n got %+v\nwant %+v", end, want)
	}

	dirs, _ := filepath.Glob(filepath.Join(out, "msmemscope_*"))
	if len(dirs) != 1 {
		t.Fatalf("captures: %v", dirs)
	}
	tl, err := analyzer.CaptureTimeline(dirs[0], 100, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The planted levels, in order: 3 MiB (scratch), 4 (+grow), 5, 6, then
	// 3 after the free (6 - 3), 4, 5. Each level must appear as the maximum
	// of consecutive intervals, in this order, lasting about 200 ms.
	levels := []uint64{4 * mib, 5 * mib, 6 * mib, 4 * mib, 5 * mib}
	var seq []uint64
	for _, p := range tl.Points {
		if p.MaxLive >= mib && (len(seq) == 0 || seq[len(seq)-1] != p.MaxLive) {
			seq = append(seq, p.MaxLive)
		}
	}
	if !containsInOrder(seq, levels) {
		t.Errorf("timeline levels %v do not hold the planted %v", seq, levels)
	}
	// In time: the first 1 MiB step lands 150 ms (+ start-up) after the first
	// event, so within interval 1 or 2; the 6 MiB plateau is about 2 intervals long.
	first6 := -1
	n6 := 0
	for i, p := range tl.Points {
		if p.MaxLive == 6*mib {
			if first6 < 0 {
				first6 = i
			}
			n6++
		}
	}
	if n6 < 2 || n6 > 3 {
		t.Errorf("6 MiB held for %d intervals, want 2 (±1)", n6)
	}
	// The report at the 6 MiB peak names both sites.
	peak, _ := tl.Peak()
	if peak.MaxLive != 6*mib {
		t.Fatalf("peak %d, want %d", peak.MaxLive, 6*mib)
	}
	rep, err := analyzer.CaptureReportAt(dirs[0], 100, peak.Ms)
	if err != nil {
		t.Fatal(err)
	}
	if rep.TotalSize != 6*mib || len(rep.Report) != 2 || rep.Report[0].Size != 3*mib || rep.Report[1].Size != 3*mib {
		t.Errorf("report at the peak: %+v", rep)
	}
	// The CLI prints the same.
	txt, _ := run(t, cli, "--timeline", "--input="+dirs[0], "--interval-ms=100")
	if !strings.Contains(txt, "total 6291456") || !strings.Contains(txt, "prog.c:7") || !strings.Contains(txt, "prog.c:8") {
		t.Errorf("msmemscope --timeline printed:\n%s", txt)
	}
}

// handoffProg: four threads allocate blocks at one site and free the blocks
// the thread beside them allocated, keeping a third; between rounds, with
// every thread waiting, main asks for the report and prints what it should
// say. Blocks freed by another thread are the normal case.
const handoffProg = `#include <msmemscope.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define T 4
#define K 400
#define ROUNDS 6
static void *blk[T][K];
static size_t sz[T][K];
static pthread_barrier_t bar;
static size_t live_bytes, live_count;
static __attribute__((noinline)) void *make_block(size_t n) { void *p = malloc(n); memset(p, 1, 8); return p; }
static void *worker(void *arg) {
	int t = (int)(long)arg;
	for (int r = 0; r < ROUNDS; r++) {
		for (int i = 0; i < K; i++) {
			sz[t][i] = 16 + ((t * 131 + i * 7 + r * 13) % 600);
			blk[t][i] = make_block(sz[t][i]);
		}
		pthread_barrier_wait(&bar);
		int o = (t + 1) % T; /* the neighbour's blocks */
		for (int i = 0; i < K; i++)
			if (i % 3 != 0) free(blk[o][i]);
		pthread_barrier_wait(&bar);
		pthread_barrier_wait(&bar); /* main reports */
	}
	return NULL;
}
int main(void) {
	pthread_t th[T];
	pthread_barrier_init(&bar, NULL, T + 1);
	for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, worker, (void *)t);
	for (int r = 0; r < ROUNDS; r++) {
		pthread_barrier_wait(&bar);
		for (int t = 0; t < T; t++)
			for (int i = 0; i < K; i += 3) { live_bytes += sz[t][i]; live_count++; }
		pthread_barrier_wait(&bar);
		char *rep = msmemscope_get_mem_report();
		printf("EXPECT %zu %zu\nREPORT %s\n", live_bytes, live_count, rep ? rep : "null");
		fflush(stdout);
		msmemscope_free_string(rep);
		pthread_barrier_wait(&bar);
	}
	for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
	return 0;
}
`

// TestLiveReportFollowsThreadsIncrementally: each report names exactly the
// blocks the program keeps at make_block, though most were freed by a
// thread other than their allocator's, and each call reads only what the
// spool gained since the one before.
func TestLiveReportFollowsThreadsIncrementally(t *testing.T) {
	cli, libDir := build(t)
	prog := compile(t, libDir, handoffProg)
	stdout, stderr := run(t, cli, "--output="+t.TempDir(), "--log-level=info", prog)
	var expects [][2]uint64
	var reports []analyzer.MemReport
	for _, l := range strings.Split(stdout, "\n") {
		if strings.HasPrefix(l, "EXPECT ") {
			var e [2]uint64
			f := strings.Fields(l)
			e[0], _ = strconv.ParseUint(f[1], 10, 64)
			e[1], _ = strconv.ParseUint(f[2], 10, 64)
			expects = append(expects, e)
		}
		if r, ok := strings.CutPrefix(l, "REPORT "); ok {
			var reply struct {
				OK     bool
				Result analyzer.MemReport
			}
			if err := json.Unmarshal([]byte(r), &reply); err != nil || !reply.OK {
				t.Fatalf("reply %q: %v", r, err)
			}
			reports = append(reports, reply.Result)
		}
	}
	if len(reports) != 6 || len(expects) != 6 {
		t.Fatalf("want 6 reports, got:\n%s", stdout)
	}
	for i, rep := range reports {
		var got *analyzer.SiteSize
		var sum uint64
		for j := range rep.Report {
			sum += rep.Report[j].Size
			if rep.Report[j].Function == "make_block" {
				got = &rep.Report[j]
			}
		}
		if got == nil || got.Size != expects[i][0] || uint64(got.Count) != expects[i][1] || sum != rep.TotalSize {
			t.Errorf("report %d: make_block %+v, want %d B in %d blocks (total %d, sites sum %d)", i, got, expects[i][0], expects[i][1], rep.TotalSize, sum)
		}
	}
	// Each call read only the spool's growth: what the one before had not
	// (the first, all but the file's header).
	re := regexp.MustCompile(`get_mem_report: read (\d+) new bytes of the spool's (\d+)`)
	m := re.FindAllStringSubmatch(stderr, -1)
	if len(m) != 6 {
		t.Fatalf("want 6 get_mem_report log lines, got %d:\n%s", len(m), stderr)
	}
	prev := uint64(spool.HdrSize)
	for i, x := range m {
		n, _ := strconv.ParseUint(x[1], 10, 64)
		whole, _ := strconv.ParseUint(x[2], 10, 64)
		if n == 0 || whole-n != prev {
			t.Errorf("call %d read %d new bytes of %d, after %d read before: not incremental", i, n, whole, prev)
		}
		prev = whole
	}
}

func sameReport(a, b analyzer.MemReport) bool {
	if a.TotalSize != b.TotalSize || len(a.Report) != len(b.Report) {
		return false
	}
	var sum uint64
	for i := range a.Report {
		if a.Report[i] != b.Report[i] {
			return false
		}
		sum += a.Report[i].Size
	}
	return sum == a.TotalSize
}

func containsInOrder(seq, want []uint64) bool {
	j := 0
	for _, v := range seq {
		if j < len(want) && v == want[j] {
			j++
		}
	}
	return j == len(want)
}

// churn.c: 4 threads of malloc/free traffic for a while, some blocks kept.
const churnProg = `#include <pthread.h>
#include <stdlib.h>
static void *work(void *a) {
	void *keep[256] = {0};
	for (long i = 0; i < 400000; i++) {
		char *volatile p = malloc(16 + (i & 511));
		p[0] = 1;
		int s = i & 255;
		if (keep[s]) free(keep[s]);
		keep[s] = p;
	}
	return 0;
}
int main(void) {
	pthread_t t[4];
	for (int i = 0; i < 4; i++) pthread_create(&t[i], 0, work, 0);
	for (int i = 0; i < 4; i++) pthread_join(t[i], 0);
	return 0;
}
`

func TestRotatingLogs(t *testing.T) {
	cli, libDir := build(t)
	prog := compile(t, libDir, churnProg)
	out := t.TempDir()
	run(t, cli, "--log-mode=rotate", "--log-files=3", "--log-file-mb=1", "--analysis=", "--output="+out, prog)
	dirs, _ := filepath.Glob(filepath.Join(out, "msmemscope_*"))
	if len(dirs) != 1 {
		t.Fatalf("captures: %v", dirs)
	}
	// Three logs, or two: 4 threads allocating flat out fill a 1 MiB log
	// several times over while its cut settles, and the oldest then goes
	// early (the bound: capture.TestRotatorKeepsItsBound).
	logs := spool.LogFiles(dirs[0])
	if len(logs) != 3 && len(logs) != 2 {
		t.Fatalf("%d logs kept, want 3 (2 past their bound): %v", len(logs), logs)
	}
	if !strings.HasSuffix(logs[0], "log_000001.zst") && filepath.Base(logs[0]) <= "log_000001.zst" {
		t.Errorf("the oldest logs were not deleted: %v", logs)
	}
	allFrees := 0
	for i, f := range logs {
		b, err := spool.ReadLog(f)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := spool.New(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("%s does not parse alone: %v", f, err)
		}
		// Alone, every FREE finds its block: inherited or allocated here.
		// (Counts: interpolated times may show another thread's MALLOC of a
		// reused address just before the FREE of the old block.)
		live := map[spool.BlockKey]int{}
		rd := sp.Reader()
		frees := 0
		for {
			r, ns, err := rd.Next()
			if err != nil {
				t.Fatal(err)
			}
			if r == nil {
				break
			}
			k := spool.KeyOf(r)
			switch r.Kind {
			case format.RMalloc:
				live[k]++
			case format.RFree:
				if live[k] <= 0 {
					t.Fatalf("%s: a FREE of %#x by thread %d at %d ns without its block", f, r.A, r.Tid, ns)
				}
				live[k]--
				frees++
			}
		}
		// The newest log may hold only the run's last few records: the
		// one before it filled up just before them.
		if frees == 0 && i < len(logs)-1 {
			t.Errorf("%s holds no frees", f)
		}
		allFrees += frees
	}
	if allFrees == 0 {
		t.Errorf("the logs hold no frees")
	}
	// The newest log covers the end of the run: of the program's events,
	// none is left to the late spool (events after the final drain).
	late, err := os.ReadFile(filepath.Join(dirs[0], spool.SpoolDir, spool.LateFile))
	if err != nil {
		t.Fatal(err)
	}
	sp, err := spool.New(bytes.NewReader(late), int64(len(late)))
	if err != nil {
		t.Fatalf("late spool: %v", err)
	}
	for rd := sp.Reader(); ; {
		r, _, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			break
		}
		if r.Kind == format.RMalloc || r.Kind == format.RFree {
			t.Fatalf("the late spool holds a %v of %#x (size %d) by thread %d: the logs missed it", r.Kind, r.A, r.B, r.Tid)
		}
	}
	// The logs are the record: no dump at exit; --input= writes it.
	if dumps, _ := filepath.Glob(filepath.Join(dirs[0], "dump", "*.csv")); len(dumps) != 0 {
		t.Fatalf("a rotated run wrote a dump at exit: %v", dumps)
	}
	run(t, cli, "--input="+dirs[0], "--analysis=")
	dumps, _ := filepath.Glob(filepath.Join(dirs[0], "dump", "*.csv"))
	if len(dumps) != 1 {
		t.Fatalf("dumps: %v", dumps)
	}
	rd, err := trace.Open(dumps[0], trace.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	rows := 0
	for {
		e, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			break
		}
		rows++
	}
	if rows == 0 {
		t.Errorf("the dump is empty")
	}
	// Parsing in parallel gives the same timeline as one goroutine.
	one, err := analyzer.ParseLogs(dirs[0], 100, 1)
	if err != nil {
		t.Fatal(err)
	}
	two, err := analyzer.ParseLogs(dirs[0], 100, 2)
	if err != nil || one != two || one.Events == 0 {
		t.Errorf("parse with 1 worker %+v, with 2 %+v (%v)", one, two, err)
	}
}
