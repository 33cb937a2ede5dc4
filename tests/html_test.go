package tests

import (
	"context"
	"encoding/json"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The HTML report (--export=html), opened in headless Chromium as a person
// would: no script error, the planted leak's function in the leak flame
// graph, one marker per step, the leak named in the visible text. A
// screenshot of each is kept in the build folder (test-output/html/).

// reportData is the part of the page's inlined data the tests check.
type reportData struct {
	Processes []struct {
		Pid    int64    `json:"pid"`
		Frames []string `json:"frames"`
		Sites  []struct {
			Stack  []int32 `json:"stack"`
			Type   string  `json:"type"`
			AllocN int64   `json:"alloc_n"`
			TempN  int64   `json:"temp_n"`
		} `json:"sites"`
		Tops  map[string][]int `json:"tops"`
		Leaks []struct {
			Kind   string `json:"kind"`
			Site   int    `json:"site"`
			Bytes  int64  `json:"bytes"`
			Blocks int64  `json:"blocks"`
			Step0  int32  `json:"step0"`
			Step1  int32  `json:"step1"`
		} `json:"leaks"`
		Steps []struct {
			T0 uint64 `json:"t0"`
			T1 uint64 `json:"t1"`
		} `json:"steps"`
		Views []struct {
			Peak int64 `json:"peak"`
		} `json:"views"`
	} `json:"processes"`
}

var dataRe = regexp.MustCompile(`(?s)<script type="application/json" id="msmemscope-data">(.*?)</script>`)

func readReport(t *testing.T, path string) *reportData {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 20<<20 {
		t.Errorf("%s: %d bytes, over 20 MB", path, len(b))
	}
	for _, ref := range []string{"http://", "https://", "src=", "href=\"http"} {
		if strings.Contains(strings.ReplaceAll(string(b), "http://www.w3.org/2000/svg", ""), ref) {
			t.Errorf("%s refers to %q: the report must open with no network", path, ref)
		}
	}
	m := dataRe.FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no inlined data", path)
	}
	var d reportData
	if err := json.Unmarshal(m[1], &d); err != nil {
		t.Fatalf("%s: data: %v", path, err)
	}
	return &d
}

// inner is a site's innermost frame.
func (d *reportData) inner(p, site int) string {
	s := d.Processes[p].Sites[site].Stack
	return d.Processes[p].Frames[s[len(s)-1]]
}

// chromium loads the page headless and returns its DOM after the scripts
// ran; it fails the test on any console message, and saves a screenshot.
func chromium(t *testing.T, page, shot string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (make test installs it)")
	}
	profile := t.TempDir()
	run := func(args ...string) (string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--headless=new", "--no-sandbox", "--disable-gpu",
			"--user-data-dir=" + profile, "--enable-logging=stderr", "--log-level=0", "--no-first-run"}, args...)...)
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, se.String())
		}
		for _, l := range strings.Split(se.String(), "\n") {
			if strings.Contains(l, ":CONSOLE") {
				t.Errorf("the page's console: %s", l)
			}
		}
		return so.String(), se.String()
	}
	dom, _ := run("--dump-dom", "file://"+page)
	if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(shot)
	run("--window-size=1280,2400", "--screenshot="+shot, "file://"+page)
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 10000 {
		t.Errorf("no screenshot at %s (%v)", shot, err)
	}
	return dom
}

var (
	scriptRe = regexp.MustCompile(`(?s)<(script|style)[^>]*>.*?</(script|style)>`)
	tagRe    = regexp.MustCompile(`(?s)<[^>]*>`)
)

// visible is the page's text without its scripts, styles and tags.
func visible(dom string) string {
	return html.UnescapeString(tagRe.ReplaceAllString(scriptRe.ReplaceAllString(dom, " "), " "))
}

// section returns the DOM of the element with id, up to the next one with
// an id of the same family (a crude cut, enough for counting).
func section(dom, id, next string) string {
	i := strings.Index(dom, `id="`+id+`"`)
	if i < 0 {
		return ""
	}
	rest := dom[i:]
	if j := strings.Index(rest[1:], `id="`+next); j >= 0 {
		return rest[:j+1]
	}
	return rest
}

func shotPath(name string) string { return filepath.Join(buildDir, "test-output", "html", name+".png") }

// The C leak demo: its 5 steps, and remember_batch's 4 blocks (steps 2-5)
// in the leak flame graph and table.
func TestReportHTMLLeakDemo(t *testing.T) {
	bin := compile(t, filepath.Join(repoRoot, "examples", "leak_demo.c"), "", linkMemscope()...)
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, "--call-stack=c:8", "--export=html", bin)
	if r.Code != 0 {
		t.Fatalf("exit %d\n%s", r.Code, r.Stderr)
	}
	main := readManifest(t, out).main(t)
	page := onlyFile(t, filepath.Join(main.Folder, "export", "report_*.html"))
	if !strings.Contains(r.Stderr, "export written to "+page) {
		t.Errorf("the console does not name %s:\n%s", page, r.Stderr)
	}
	d := readReport(t, page)
	if len(d.Processes) != 1 || len(d.Processes[0].Steps) != 5 {
		t.Fatalf("processes %d, steps %v", len(d.Processes), d.Processes[0].Steps)
	}
	found := false
	for _, l := range d.Processes[0].Leaks {
		if strings.HasPrefix(d.inner(0, l.Site), "remember_batch ") {
			found = true
			if l.Bytes != 4*1008 || l.Blocks != 4 || l.Step0 != 2 || l.Step1 != 5 {
				t.Errorf("remember_batch's leak: %+v, want 4032 bytes in 4 blocks, steps 2-5", l)
			}
		}
	}
	if !found {
		t.Errorf("no leak at remember_batch: %+v", d.Processes[0].Leaks)
	}
	dom := chromium(t, page, shotPath("leak_demo"))
	pid := d.Processes[0].Pid
	flame := section(dom, "leakflame-"+strconv.FormatInt(pid, 10), "x")
	if !strings.Contains(flame, `data-frame="remember_batch `) {
		t.Errorf("the leak flame graph has no remember_batch cell:\n%.2000s", flame)
	}
	if n := strings.Count(dom, `class="step-marker"`); n != 5 {
		t.Errorf("%d step markers, want 5", n)
	}
	if !strings.Contains(visible(dom), "remember_batch leak_demo.c:14") {
		t.Errorf("the visible text does not name the leak")
	}
}

// A threaded C++ program: frees from other threads leave nothing alive, the
// dropped Sessions are definitely lost (the default leak flame graph), and
// scratch()'s 100 temporary allocations top the temporary table.
func TestReportHTMLThreadsCxx(t *testing.T) {
	bin := compile(t, "threads_cxx.cpp", "", append(linkMemscope(), "-pthread")...)
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, "--call-stack=c:12", "--export=html", bin)
	if r.Code != 0 {
		t.Fatalf("exit %d\n%s", r.Code, r.Stderr)
	}
	page := onlyFile(t, filepath.Join(readManifest(t, out).main(t).Folder, "export", "report_*.html"))
	d := readReport(t, page)
	p := d.Processes[0]
	if len(p.Steps) != 3 {
		t.Fatalf("steps %d, want 3", len(p.Steps))
	}
	var lost, produced int64
	for _, l := range p.Leaks {
		in := d.inner(0, l.Site)
		if strings.Contains(in, "produce") {
			produced += l.Bytes
		}
		if strings.Contains(in, "lose_session") {
			if l.Kind != "definitely_lost" || l.Bytes != 3*3008 || l.Blocks != 3 || l.Step0 != 1 || l.Step1 != 3 {
				t.Errorf("lose_session's leak: %+v, want definitely_lost, 9024 bytes in 3 blocks, steps 1-3", l)
			}
			lost += l.Bytes
		}
	}
	if lost == 0 || produced != 0 {
		t.Errorf("lose_session lost %d bytes (want 9024); Items alive %d (want 0: the consumer freed them all)", lost, produced)
	}
	// (Items a producer makes and the consumer deletes before any other
	// allocation count as temporary too, as many as the threads'
	// interleaving gives: scratch need not lead the list, but is on it
	// with exactly its 100.)
	scratchTemps := int64(-1)
	for _, i := range p.Tops["temporary"] {
		if strings.Contains(d.inner(0, i), "scratch") {
			scratchTemps = p.Sites[i].TempN
		}
	}
	if scratchTemps != 100 {
		t.Errorf("scratch's temporary allocations in the top temporary sites: %d, want 100 (%v)", scratchTemps, p.Tops["temporary"])
	}
	dom := chromium(t, page, shotPath("threads_cxx"))
	if !strings.Contains(section(dom, "leakflame-"+strconv.FormatInt(p.Pid, 10), "x"), `data-frame="lose_session`) {
		t.Errorf("the leak flame graph has no lose_session cell")
	}
	if n := strings.Count(dom, `class="step-marker"`); n != 3 {
		t.Errorf("%d step markers, want 3", n)
	}
	if !strings.Contains(visible(dom), "definitely_lost") || !strings.Contains(visible(dom), "lose_session") {
		t.Errorf("the visible text does not name the definitely lost Sessions")
	}
}

// A run of two traced processes (a program that execs the leak demo in a
// child): each capture has its own page, and the output folder one over
// both, with a summary across them.
func TestReportHTMLRun(t *testing.T) {
	demo := compile(t, filepath.Join(repoRoot, "examples", "leak_demo.c"), "", linkMemscope()...)
	bin := compile(t, "execchild.c", "")
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, "--call-stack=c:8", "--export=html", bin, demo)
	if r.Code != 0 {
		t.Fatalf("exit %d\n%s", r.Code, r.Stderr)
	}
	man := readManifest(t, out)
	if len(man.Processes) != 2 {
		t.Fatalf("%d processes", len(man.Processes))
	}
	for _, p := range man.Processes {
		onlyFile(t, filepath.Join(p.Folder, "export", "report_*.html"))
	}
	// --timeline of the output folder is its main process's: said, with
	// the count (it read one process of several without a word).
	if tl := runCLI(t, 60*time.Second, "", "--timeline", "--input="+out); tl.Code != 0 || !strings.Contains(tl.Stderr, "holds 2 traced processes: the timeline is the main one's") {
		t.Errorf("--timeline of the run's folder: exit %d\n%s", tl.Code, tl.Stderr)
	}
	page := onlyFile(t, filepath.Join(out, "export", "report_*.html"))
	if !strings.Contains(r.Stderr, "report of the run's 2 processes written to "+page) {
		t.Errorf("the console does not name %s:\n%s", page, r.Stderr)
	}
	d := readReport(t, page)
	if len(d.Processes) != 2 {
		t.Fatalf("the run's page holds %d processes", len(d.Processes))
	}
	leaked := -1
	for i, p := range d.Processes {
		for _, l := range p.Leaks {
			if strings.HasPrefix(d.inner(i, l.Site), "remember_batch ") {
				leaked = i
			}
		}
	}
	if leaked < 0 || len(d.Processes[leaked].Steps) != 5 {
		t.Fatalf("no process of the page holds the demo's leak and 5 steps")
	}
	dom := chromium(t, page, shotPath("run"))
	text := visible(dom)
	if !strings.Contains(text, "Summary across 2 processes") || strings.Count(dom, `class="proc"`) != 2 {
		t.Errorf("the page has no summary across the 2 processes")
	}
	if n := strings.Count(dom, `class="step-marker"`); n != 5 {
		t.Errorf("%d step markers, want the demo's 5", n)
	}
}
