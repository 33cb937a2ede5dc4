package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"msmemscope/trace"
)

// The CUDA driver layer (SPEC §4.4) against a stand-in driver
// (progs/cuda/standin_cuda.c, built as libcuda.so.1): the same workload
// (progs/cuda/workload.h) reached the three ways programs reach the driver.
// Its known allocations are the oracle: no GPU is needed.

var (
	standinOnce sync.Once
	standinDir  string
	standinErr  string
)

// standin builds the stand-in driver once: DIR/libcuda.so.1 (and libcuda.so
// for -lcuda).
func standin(t *testing.T) string {
	t.Helper()
	needBuild(t)
	standinOnce.Do(func() {
		dir := filepath.Join(binDir, "cuda")
		src := filepath.Join(progsDir, "cuda", "standin_cuda.c")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			standinErr = err.Error()
			return
		}
		cmd := exec.Command("gcc", "-O0", "-g", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), src, "-Wl,-soname,libcuda.so.1")
		if b, err := cmd.CombinedOutput(); err != nil {
			standinErr = string(b) + err.Error()
			return
		}
		if err := os.Symlink("libcuda.so.1", filepath.Join(dir, "libcuda.so")); err != nil {
			standinErr = err.Error()
			return
		}
		standinDir = dir
	})
	if standinErr != "" {
		t.Fatalf("building the stand-in driver: %s", standinErr)
	}
	return standinDir
}

// cudaProg builds one of the workload's programs.
func cudaProg(t *testing.T, name string) string {
	dir := standin(t)
	src := filepath.Join(progsDir, "cuda", name+".c")
	if name == "cuda_direct" {
		return compile(t, src, "cuda", "-L"+dir, "-lcuda", "-Wl,-rpath,"+dir)
	}
	return compile(t, src, "cuda", "-ldl")
}

// runCUDA runs a workload program under the CLI and returns its rows.
func runCUDA(t *testing.T, prog string, opts ...string) []*trace.Event {
	t.Helper()
	evs, _ := runCUDAFolder(t, prog, opts...)
	return evs
}

// runCUDAFolder is runCUDA, with the process folder too.
func runCUDAFolder(t *testing.T, prog string, opts ...string) ([]*trace.Event, string) {
	t.Helper()
	bin := cudaProg(t, prog)
	out := filepath.Join(t.TempDir(), "out")
	args := append([]string{"--output=" + out}, opts...)
	r := runCLIEnv(t, 120*time.Second, "", []string{"LD_LIBRARY_PATH=" + standin(t)}, append(args, bin)...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "ok") {
		t.Fatalf("%s: exit %d\nstdout:\n%s\nstderr:\n%s", prog, r.Code, r.Stdout, r.Stderr)
	}
	folder := readManifest(t, out).main(t).Folder
	return readDump(t, dumpOf(t, folder)), folder
}

// devTotals sums a dump's CUDA memory rows: per Event Type, device and
// kind, the MALLOCs, their bytes and the blocks still alive at the end.
type devTotals struct{ mallocs, bytes, alive, aliveBytes uint64 }

func cudaTotals(t *testing.T, evs []*trace.Event) map[string]*devTotals {
	t.Helper()
	tot := map[string]*devTotals{}
	live := map[uint64]string{}
	sizes := map[uint64]uint64{}
	for _, e := range evs {
		if e.Type != trace.TypeHAL && e.Type != trace.TypeHostPinned {
			continue
		}
		switch e.Kind {
		case trace.KindMalloc:
			kind, _ := e.Get("kind")
			key := e.Type + "/" + e.Device + "/" + kind
			if tot[key] == nil {
				tot[key] = &devTotals{}
			}
			tot[key].mallocs++
			tot[key].bytes += e.Size
			tot[key].alive++
			tot[key].aliveBytes += e.Size
			live[e.AllocID], sizes[e.AllocID] = key, e.Size
		case trace.KindFree:
			key, ok := live[e.AllocID]
			if !ok || sizes[e.AllocID] != e.Size {
				t.Fatalf("FREE %d (0x%x, %d B) pairs with no live MALLOC of its size", e.AllocID, e.Ptr, e.Size)
			}
			delete(live, e.AllocID)
			tot[key].alive--
			tot[key].aliveBytes -= e.Size
		}
	}
	return tot
}

// The workload's allocations, as workload.h states them.
var cudaWant = map[string]devTotals{
	"HAL/0/device":      {mallocs: 5, bytes: 3314336, alive: 2, aliveBytes: 310240},
	"HAL/0/managed":     {mallocs: 1, bytes: 65536, alive: 1, aliveBytes: 65536},
	"HAL/1/device":      {mallocs: 1, bytes: 8192, alive: 1, aliveBytes: 8192},
	"HAL/0/vmm":         {mallocs: 1, bytes: 2097152, alive: 1, aliveBytes: 2097152},
	"HAL/1/vmm":         {mallocs: 1, bytes: 2097152, alive: 0, aliveBytes: 0},
	"HOST_PINNED/host/": {mallocs: 2, bytes: 1052672, alive: 1, aliveBytes: 1048576},
}

func TestCUDADriverMemoryExact(t *testing.T) {
	for _, prog := range []string{"cuda_direct", "cuda_dlsym", "cuda_procaddr"} {
		t.Run(prog, func(t *testing.T) {
			evs, folder := runCUDAFolder(t, prog, "--level=kernel", "--analysis=leaks,decompose")
			got := cudaTotals(t, evs)
			for k, w := range cudaWant {
				g := got[k]
				if g == nil || *g != w {
					t.Errorf("%s: %+v, want %+v", k, g, w)
				}
			}
			for k := range got {
				if _, ok := cudaWant[k]; !ok {
					t.Errorf("unexpected rows %s: %+v", k, got[k])
				}
			}
			// The async allocations name their stream.
			streams := 0
			for _, e := range evs {
				if s, _ := e.Get("stream"); e.Kind == trace.KindMalloc && s == "0x1234" {
					streams++
				}
			}
			if streams != 2 {
				t.Errorf("%d MALLOCs with stream 0x1234, want 2 (cuMemAllocAsync, cuMemAllocFromPoolAsync)", streams)
			}
			// The driver layer makes no host rows of its own: the program
			// itself allocates nothing (valgrind: 0 allocs for cuda_direct;
			// the others' only blocks are dlopen's).
			if prog == "cuda_direct" {
				for _, e := range evs {
					if e.Type == trace.TypeHost {
						t.Errorf("a HOST row in a program that allocates nothing: %+v", e)
					}
				}
			}
			checkLaunches(t, evs)
			checkMappings(t, evs, cudaMappings)
			checkDeviceLeaks(t, folder)
		})
	}
}

// The workload's VMM mappings (workload.h): MAP and UNMAP rows of Event
// Type HAL on their handle's device (g2's is device 1, mapped while device 0
// is current), Ptr the virtual address; the refused calls make none.
var cudaMappings = []string{
	"MAP HAL 0 0x7c0000000000 {size:2097152,offset:0,handle:0x1000}",
	"MAP HAL 1 0x7c0000200000 {size:1048576,offset:0,handle:0x1010}",
	"MAP HAL 1 0x7c0000300000 {size:1048576,offset:1048576,handle:0x1010}",
	"UNMAP HAL 1 0x7c0000200000 {size:2097152,handle:0x1010}",
}

// checkMappings compares the MAP and UNMAP rows with want, and checks that
// they fall between their handle's MALLOC and FREE.
func checkMappings(t *testing.T, evs []*trace.Event, want []string) {
	t.Helper()
	var got []string
	life := map[string][2]uint64{} // handle -> IDs of its MALLOC and FREE
	for _, e := range evs {
		if e.IsMemory() && e.Type == trace.TypeHAL {
			if k, _ := e.Get("kind"); k == "vmm" {
				l := life[fmt.Sprintf("0x%x", e.Ptr)]
				l[map[bool]int{true: 0, false: 1}[e.Kind == trace.KindMalloc]] = e.ID
				life[fmt.Sprintf("0x%x", e.Ptr)] = l
			}
		}
		if e.Kind != trace.KindMap && e.Kind != trace.KindUnmap {
			continue
		}
		got = append(got, fmt.Sprintf("%s %s %s 0x%x %s", e.Kind, e.Type, e.Device, e.Ptr, e.Attr()))
		h, _ := e.Get("handle")
		if l := life[h]; l[0] == 0 || l[0] > e.ID || (l[1] != 0 && l[1] < e.ID) {
			t.Errorf("%s row %d outside its handle %s's MALLOC and FREE (rows %v)", e.Kind, e.ID, h, l)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("mapping rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// checkDeviceLeaks: the exit leaks of CUDA memory are the blocks alive at
// exit, each once (a mapping adds no bytes), and decompose's HAL owner
// (device, managed, VMM and pinned blocks) ends with their bytes.
func checkDeviceLeaks(t *testing.T, folder string) {
	t.Helper()
	var hal, pinned uint64
	blocks := 0
	for _, l := range readLeaks(t, folder) {
		switch {
		case l.kind == "EXIT" && l.typ == trace.TypeHAL:
			hal += l.size
			blocks += l.blocks
		case l.kind == "EXIT" && l.typ == trace.TypeHostPinned:
			pinned += l.size
		}
	}
	var wantHAL uint64
	wantBlocks := 0
	for k, w := range cudaWant {
		if strings.HasPrefix(k, "HAL/") {
			wantHAL += w.aliveBytes
			wantBlocks += int(w.alive)
		}
	}
	if hal != wantHAL || blocks != wantBlocks || pinned != cudaWant["HOST_PINNED/host/"].aliveBytes {
		t.Errorf("exit leaks: HAL %d B in %d blocks, pinned %d B; want %d B in %d blocks, %d B", hal, blocks, pinned,
			wantHAL, wantBlocks, cudaWant["HOST_PINNED/host/"].aliveBytes)
	}
	// decompose's HAL lines (category and owner): peak while g1 and g2
	// were both alive (workload.h's order), end and MALLOCs.
	b, err := os.ReadFile(onlyFile(t, filepath.Join(folder, "analysis", "decompose_*.csv")))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("HAL,6626848,%d,11", wantHAL+cudaWant["HOST_PINNED/host/"].aliveBytes)
	found := 0
	for _, ln := range strings.Split(string(b), "\n") {
		if _, rest, ok := strings.Cut(ln, ","); ok && strings.HasPrefix(rest, "HAL,") {
			found++
			if rest != want {
				t.Errorf("decompose: %q, want Name,Peak,End,Allocations %q", ln, want)
			}
		}
	}
	if found == 0 {
		t.Errorf("decompose: no HAL line in\n%s", b)
	}
}

// Kernel launches with --level=kernel: demangled names, grid, block and
// stream; the CUDA ordinal as Device Id.
func checkLaunches(t *testing.T, evs []*trace.Event) {
	t.Helper()
	var got []string
	for _, e := range evs {
		if e.Kind != trace.KindKernelLaunch {
			continue
		}
		grid, _ := e.Get("grid")
		block, _ := e.Get("block")
		stream, _ := e.Get("streamId")
		got = append(got, strings.Join([]string{e.Device, e.Name, grid, block, stream}, " | "))
	}
	want := []string{
		"0 | void scale<4>(float*, int) | 2x1x1 | 128x1x1 | 0x1234",
		"0 | void scale<4>(float*, int) | 2x1x1 | 128x1x1 | 0x1234",
		"0 | void scale<4>(float*, int) | 2x1x1 | 128x1x1 | 0x1234",
		"0 | add(float const*, float const*, float*, int) | 10x2x1 | 256x1x1 | 0x0",
		"0 | add(float const*, float const*, float*, int) | 4x4x1 | 32x8x1 | 0x1234",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("launches:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// --level=op records no kernel launch; --device picks the ordinals
// recorded (pinned host memory belongs to any CUDA device); --device=cpu
// records no CUDA memory at all.
func TestCUDAOptions(t *testing.T) {
	evs := runCUDA(t, "cuda_procaddr")
	for _, e := range evs {
		if e.Kind == trace.KindKernelLaunch {
			t.Fatalf("a KERNEL_LAUNCH row without --level=kernel: %+v", e)
		}
	}
	if got := cudaTotals(t, evs); len(got) != len(cudaWant) {
		t.Errorf("default options: %d kinds of CUDA rows, want %d", len(got), len(cudaWant))
	}
	checkMappings(t, evs, cudaMappings)

	// Device 1's: its blocks, and the mappings of its VMM handle (made
	// while device 0 was current).
	evs = runCUDA(t, "cuda_direct", "--device=cpu,cuda:1")
	got := cudaTotals(t, evs)
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if strings.Join(keys, " ") != "HAL/1/device HAL/1/vmm HOST_PINNED/host/" || *got["HAL/1/device"] != cudaWant["HAL/1/device"] ||
		*got["HAL/1/vmm"] != cudaWant["HAL/1/vmm"] {
		t.Errorf("--device=cpu,cuda:1: rows %v (%+v), want device 1's and the pinned ones", keys, got["HAL/1/device"])
	}
	checkMappings(t, evs, cudaMappings[1:])

	evs = runCUDA(t, "cuda_dlsym", "--device=cpu")
	if got := cudaTotals(t, evs); len(got) != 0 {
		t.Errorf("--device=cpu: CUDA rows %v", got)
	}
	checkMappings(t, evs, nil)

	// Collection never switched on (deferred, no start()): no row at all.
	for _, e := range runCUDA(t, "cuda_direct", "--level=kernel", "--collect-mode=deferred") {
		if e.Kind == trace.KindKernelLaunch || e.Kind == trace.KindOOM || e.Type == trace.TypeHAL || e.Type == trace.TypeHostPinned {
			t.Fatalf("a row while collection was off: %+v", e)
		}
	}
}

// A plugin linked with -lcuda and dlopen'ed RTLD_LOCAL: its calls reach
// msmemscope's exported names, which find the driver through the plugin's
// own libcuda, not only RTLD_NEXT (that once answered "not initialized").
func TestCUDAPluginLinkedWithDriver(t *testing.T) {
	dir := standin(t)
	src := filepath.Join(progsDir, "cuda", "cuda_plugin.c")
	inc := filepath.Join(progsDir, "cuda")
	plugin := compile(t, src, "cudaplugin", "-DPLUGIN", "-shared", "-fPIC", "-I", inc, "-L"+dir, "-lcuda", "-Wl,-rpath,"+dir)
	bin := compile(t, src, "cuda", "-I", inc, "-ldl")
	out := filepath.Join(t.TempDir(), "out")
	r := runCLI(t, 60*time.Second, "", "--output="+out, bin, plugin)
	if r.Code != 0 || strings.TrimSpace(r.Stdout) != "plugin 0" {
		t.Fatalf("exit %d, stdout %q\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
	}
	n := 0
	for _, e := range readDump(t, dumpOf(t, readManifest(t, out).main(t).Folder)) {
		if e.Type == trace.TypeHAL && e.Size == 777777 && e.Device == "0" {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d HAL rows of the plugin's 777777-byte block, want its MALLOC and FREE", n)
	}
}

// A driver allocation's C stack starts at the program's call: the wrapper's
// frames are msmemscope's own, removed.
func TestCUDAStacksNameTheCaller(t *testing.T) {
	evs := runCUDA(t, "cuda_direct", "--call-stack=c:6")
	n := 0
	for _, e := range evs {
		if e.Kind == trace.KindMalloc && e.Type == trace.TypeHAL {
			n++
			if !strings.Contains(e.CStack, "workload") {
				t.Errorf("HAL MALLOC %d: C stack %q does not name workload()", e.AllocID, e.CStack)
			}
		}
	}
	if n != 9 {
		t.Errorf("%d HAL MALLOCs, want 9", n)
	}
}

// A refused allocation (CUDA_ERROR_OUT_OF_MEMORY, injected at the workload's
// fifth device allocation, the 2,000,000-byte async one): an OOM row with
// the request, and a report of what was live on that device then, by site.
func TestCUDAOutOfMemory(t *testing.T) {
	bin := cudaProg(t, "cuda_direct")
	out := filepath.Join(t.TempDir(), "out")
	r := runCLIEnv(t, 120*time.Second, "", []string{"LD_LIBRARY_PATH=" + standin(t), "STANDIN_CUDA_OOM_AT=5"},
		"--output="+out, "--call-stack=c:4", bin)
	if r.Code != 1 { // the workload stops at the failed call
		t.Fatalf("exit %d, want the program's 1\nstdout:\n%s\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
	}
	mp := readManifest(t, out).main(t)
	var ooms []*trace.Event
	for _, e := range readDump(t, dumpOf(t, mp.Folder)) {
		if e.Kind == trace.KindOOM {
			ooms = append(ooms, e)
		}
	}
	if len(ooms) != 1 {
		t.Fatalf("%d OOM rows, want 1", len(ooms))
	}
	o := ooms[0]
	if size, _ := o.Get("size"); o.Type != trace.TypeHAL || o.Device != "0" || size != "2000000" || !strings.Contains(o.CStack, "workload") {
		t.Errorf("OOM row %+v: want HAL on device 0, size 2000000, asked from workload()", o)
	}
	var rep []struct {
		Row       uint64 `json:"row"`
		Device    string `json:"device"`
		Requested uint64 `json:"requested"`
		Live      struct {
			Total uint64 `json:"total_size"`
			Sites []struct {
				Function string `json:"function"`
				Size     uint64 `json:"size"`
				Count    int    `json:"count"`
			} `json:"mem_report"`
		} `json:"live"`
	}
	readJSON(t, onlyFile(t, filepath.Join(mp.Folder, "analysis", "oom_report_*.json")), &rep)
	// Live on device 0 then: d1, d2, the pitch block and the managed one.
	if len(rep) != 1 || rep[0].Row != o.ID || rep[0].Requested != 2000000 || rep[0].Live.Total != 1000000+4096+10240+65536 {
		t.Fatalf("oom report %+v", rep)
	}
	blocks := 0
	for _, s := range rep[0].Live.Sites {
		blocks += s.Count
		if s.Function != "workload" {
			t.Errorf("site %+v: want workload()", s)
		}
	}
	if blocks != 4 || !strings.Contains(r.Stderr+r.Stdout, "1 CUDA allocation(s) refused for want of memory") {
		t.Errorf("%d blocks in the report, want 4; console:\n%s", blocks, r.Stderr)
	}
}

// nvtxInclude is the nvtx3 headers' folder in the Python environment the
// Makefile made (nvidia-nvtx, from PyPI).
func nvtxInclude(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(pythonPath(t), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").Output()
	if err != nil {
		t.Fatalf("the Python environment: %v", err)
	}
	ms, _ := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "nvidia", "*", "include", "nvtx3", "nvToolsExt.h"))
	if len(ms) == 0 {
		t.Fatalf("no nvtx3 headers under %s: make test installs nvidia-nvtx into the virtual environment", strings.TrimSpace(string(out)))
	}
	return filepath.Dir(filepath.Dir(ms[0]))
}

// NVTX marks and ranges, from any library built with NVTX's headers, are
// MSTX rows: msmemscope is NVTX's injection library (NVTX_INJECTION64_PATH,
// which the CLI sets). Pushed ranges end in their thread and domain; a
// registered string names its range.
func TestNVTXAsMstx(t *testing.T) {
	bin := compile(t, "nvtx_ranges.c", "", "-I", nvtxInclude(t), "-ldl", "-pthread")
	rowsOf := func(env ...string) ([]string, *result) {
		out := filepath.Join(t.TempDir(), "out")
		r := runCLIEnv(t, 60*time.Second, "", env, "--output="+out, bin)
		if r.Code != 0 || strings.TrimSpace(r.Stdout) != "ok" {
			t.Fatalf("exit %d, stdout %q\nstderr:\n%s", r.Code, r.Stdout, r.Stderr)
		}
		var got []string
		for _, e := range readDump(t, dumpOf(t, readManifest(t, out).main(t).Folder)) {
			if e.Kind == trace.KindMstx {
				got = append(got, e.Type+" "+e.Name)
			}
		}
		return got, r
	}
	got, _ := rowsOf()
	want := []string{
		"Mark hello", "Range_start outer", "Range_start step start", "Range_end step start", "Range_end outer",
		"Range_start started", "Range_end started",
		"Range_start registered", "Mark ascii in domain", "Range_end registered",
		"Range_start in A", "Range_start in B", "Range_end in A", "Range_end in B",
		"Range_start worker", "Mark in worker", "Range_end worker",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("MSTX rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Another tool's injection is left in place, and said once ("./." is
	// NVTX's own "no injection").
	got, r := rowsOf("NVTX_INJECTION64_PATH=./.")
	if len(got) != 0 || !strings.Contains(r.Stderr, "NVTX_INJECTION64_PATH is set (./.), another tool's") {
		t.Errorf("with another injection: MSTX rows %v, stderr:\n%s", got, r.Stderr)
	}
}

// Each step (and start and stop) brings a SNAPSHOT row of the current CUDA
// device: cuMemGetInfo's figures, as the program itself reads them; none
// before the program has a context.
func TestCUDASnapshotsAtSteps(t *testing.T) {
	dir := standin(t)
	bin := compile(t, filepath.Join(progsDir, "cuda", "cuda_steps.c"), "cuda", append(linkMemscope(), "-I", filepath.Join(progsDir, "cuda"), "-L"+dir, "-lcuda", "-Wl,-rpath,"+dir)...)
	out := filepath.Join(t.TempDir(), "out")
	r := runCLIEnv(t, 60*time.Second, "", nil, "--output="+out, bin)
	if r.Code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.Code, r.Stderr)
	}
	var got []string
	for _, e := range readDump(t, dumpOf(t, readManifest(t, out).main(t).Folder)) {
		if e.Kind == trace.KindSnapshot {
			u, _ := e.Get("used")
			tot, _ := e.Get("total")
			got = append(got, fmt.Sprintf("used %s total %s", u, tot))
			if e.Device != "0" {
				t.Errorf("SNAPSHOT on device %q, want 0", e.Device)
			}
		}
	}
	if want := strings.TrimSpace(r.Stdout); strings.Join(got, "\n") != want {
		t.Errorf("SNAPSHOT rows:\n%s\nthe driver said:\n%s", strings.Join(got, "\n"), want)
	}
}
