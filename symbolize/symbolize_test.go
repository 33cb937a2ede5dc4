package symbolize

import (
	"bufio"
	"debug/elf"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Markers in the C sources: the line carrying "/* @NAME */" is the call
// site whose return address the program prints as "NAME 0x...".
const libSrc = `#include <stddef.h>
__attribute__((noinline)) void *lib_callee(void) {
	return __builtin_return_address(0);
}
__attribute__((noinline)) void *lib_caller(void) {
	void *r = lib_callee(); /* @lib_caller */
	return r;
}
`

const progSrc = `#include <stdio.h>
#include <stdlib.h>

void *lib_caller(void);

__attribute__((noinline)) void *callee(void) {
	return __builtin_return_address(0);
}

__attribute__((noinline)) void *caller_fn(void) {
	void *r = callee(); /* @caller_fn */
	return r;
}

static __attribute__((noinline)) void *static_caller(void) {
	void *r = callee(); /* @static_caller */
	return r;
}

int main(int argc, char **argv) {
	FILE *out = fopen(argv[1], "w");
	if (!out) return 1;
	fprintf(out, "caller_fn %p\n", caller_fn());
	fprintf(out, "static_caller %p\n", static_caller());
	fprintf(out, "lib_caller %p\n", lib_caller());
	fprintf(out, "&caller_fn %p\n", (void *)caller_fn);
	fprintf(out, "&lib_caller %p\n", (void *)lib_caller);
	fprintf(out, "MAPS\n");
	FILE *m = fopen("/proc/self/maps", "r");
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, m)) > 0) fwrite(buf, 1, n, out);
	fclose(m);
	fclose(out);
	return 0;
}
`

type fixture struct {
	dir      string
	progLine map[string]int // marker -> line in prog.c
	libLine  map[string]int // marker -> line in lib.c
	err      error
}

var (
	fixOnce sync.Once
	fix     fixture
)

func markerLines(src string) map[string]int {
	out := map[string]int{}
	re := regexp.MustCompile(`/\* @(\w+) \*/`)
	for i, l := range strings.Split(src, "\n") {
		if m := re.FindStringSubmatch(l); m != nil {
			out[m[1]] = i + 1
		}
	}
	return out
}

func run(dir, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %v\n%s", name, args, err, out)
	}
	return nil
}

// buildFixture compiles lib.c into libfoo.so, prog.c into a PIE "prog", a
// non-PIE "prog_nopie", an -rdynamic "prog_dyn", and stripped copies.
func buildFixture(t *testing.T) *fixture {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("needs Linux /proc/self/maps")
	}
	for _, tool := range []string{"gcc", "strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	fixOnce.Do(func() {
		dir, err := os.MkdirTemp("", "symbolize-test")
		if err != nil {
			fix.err = err
			return
		}
		fix.dir = dir
		fix.progLine = markerLines(progSrc)
		fix.libLine = markerLines(libSrc)
		must := func(err error) {
			if fix.err == nil && err != nil {
				fix.err = err
			}
		}
		must(os.WriteFile(filepath.Join(dir, "lib.c"), []byte(libSrc), 0o644))
		must(os.WriteFile(filepath.Join(dir, "prog.c"), []byte(progSrc), 0o644))
		cflags := []string{"-g", "-O0", "-fno-omit-frame-pointer"}
		link := []string{"-L.", "-lfoo", "-Wl,-rpath,$ORIGIN"}
		gcc := func(args ...string) { must(run(dir, "gcc", append(append([]string{}, cflags...), args...)...)) }
		gcc("-fPIC", "-shared", "lib.c", "-o", "libfoo.so")
		must(os.Mkdir(filepath.Join(dir, "stripped"), 0o755))
		must(run(dir, "strip", "libfoo.so", "-o", "stripped/libfoo.so"))
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, b := range [][]string{
			append([]string{"prog.c", "-o", "prog"}, link...),
			append([]string{"-no-pie", "prog.c", "-o", "prog_nopie"}, link...),
			append([]string{"-rdynamic", "prog.c", "-o", "prog_dyn"}, link...),
		} {
			wg.Add(1)
			go func(args []string) {
				defer wg.Done()
				err := run(dir, "gcc", append(append([]string{}, cflags...), args...)...)
				mu.Lock()
				must(err)
				mu.Unlock()
			}(b)
		}
		wg.Wait()
		must(run(dir, "strip", "prog", "-o", "stripped/prog"))
		must(run(dir, "strip", "prog_dyn", "-o", "stripped/prog_dyn"))
	})
	if fix.err != nil {
		t.Fatal(fix.err)
	}
	return &fix
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fix.dir != "" {
		os.RemoveAll(fix.dir)
	}
	os.Exit(code)
}

// runProg runs a fixture binary and returns its printed addresses and maps.
func runProg(t *testing.T, bin string) (map[string]uint64, string) {
	t.Helper()
	outFile := filepath.Join(t.TempDir(), "out.txt")
	if out, err := exec.Command(bin, outFile).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", bin, err, out)
	}
	data, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	head, maps, ok := strings.Cut(string(data), "MAPS\n")
	if !ok {
		t.Fatalf("no MAPS in output:\n%s", data)
	}
	addrs := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(head))
	for sc.Scan() {
		name, val, _ := strings.Cut(sc.Text(), " ")
		v, err := strconv.ParseUint(strings.TrimPrefix(val, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("bad line %q", sc.Text())
		}
		addrs[name] = v
	}
	return addrs, maps
}

func TestDWARF(t *testing.T) {
	f := buildFixture(t)
	for _, prog := range []string{"prog", "prog_nopie"} {
		t.Run(prog, func(t *testing.T) {
			addrs, maps := runProg(t, filepath.Join(f.dir, prog))
			s := New(maps)
			defer s.Close()
			want := map[string]string{
				"caller_fn":     fmt.Sprintf("caller_fn prog.c:%d (%s)", f.progLine["caller_fn"], prog),
				"static_caller": fmt.Sprintf("static_caller prog.c:%d (%s)", f.progLine["static_caller"], prog),
				"lib_caller":    fmt.Sprintf("lib_caller lib.c:%d (libfoo.so)", f.libLine["lib_caller"]),
			}
			for name, w := range want {
				if got := s.Frame(addrs[name]); got != w {
					t.Errorf("Frame(%s=%#x) = %q, want %q", name, addrs[name], got, w)
				}
			}
			// Frames and the cache agree with Frame.
			got := s.Frames([]uint64{addrs["caller_fn"], addrs["lib_caller"], addrs["caller_fn"]})
			if got[0] != want["caller_fn"] || got[1] != want["lib_caller"] || got[2] != got[0] {
				t.Errorf("Frames = %q", got)
			}
			if m := s.Module(addrs["lib_caller"]); m != "libfoo.so" {
				t.Errorf("Module(lib) = %q", m)
			}
			if m := s.Module(addrs["caller_fn"]); m != prog {
				t.Errorf("Module(prog) = %q", m)
			}
			if !s.InModule(addrs["lib_caller"], "libfoo.so") || s.InModule(addrs["caller_fn"], "libfoo.so") ||
				!s.InModule(addrs["lib_caller"], "libfoo*") {
				t.Error("InModule wrong")
			}
		})
	}
}

// symValue returns the st_value of a symbol in an ELF file's .symtab.
func symValue(t *testing.T, path, name string) uint64 {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			return s.Value
		}
	}
	t.Fatalf("%s not in %s", name, path)
	return 0
}

func TestStripped(t *testing.T) {
	f := buildFixture(t)
	callerVA := symValue(t, filepath.Join(f.dir, "prog"), "caller_fn")
	libVA := symValue(t, filepath.Join(f.dir, "libfoo.so"), "lib_caller")

	for _, prog := range []string{"prog", "prog_dyn"} {
		t.Run(prog, func(t *testing.T) {
			// The stripped binaries run against the stripped libfoo.so that
			// sits next to them ($ORIGIN rpath).
			addrs, maps := runProg(t, filepath.Join(f.dir, "stripped", prog))
			s := New(maps)
			defer s.Close()

			// Expected offsets: the unstripped ELF's symbol value plus the
			// return address's distance from the function's runtime start.
			// (prog and prog_dyn share the PIE text layout only in name, so
			// compute prog_dyn's from its own unstripped copy.)
			cva := callerVA
			if prog == "prog_dyn" {
				cva = symValue(t, filepath.Join(f.dir, "prog_dyn"), "caller_fn")
			}
			callerOff := cva + addrs["caller_fn"] - addrs["&caller_fn"]
			libOff := libVA + addrs["lib_caller"] - addrs["&lib_caller"]

			wantCaller := fmt.Sprintf("?? (%s+0x%x)", prog, callerOff)
			if prog == "prog_dyn" { // -rdynamic puts caller_fn in .dynsym
				wantCaller = fmt.Sprintf("caller_fn (%s+0x%x)", prog, callerOff)
			}
			if got := s.Frame(addrs["caller_fn"]); got != wantCaller {
				t.Errorf("caller_fn: got %q, want %q", got, wantCaller)
			}
			// static functions never reach .dynsym.
			if got := s.Frame(addrs["static_caller"]); !strings.HasPrefix(got, "?? ("+prog+"+0x") {
				t.Errorf("static_caller: got %q", got)
			}
			wantLib := fmt.Sprintf("lib_caller (libfoo.so+0x%x)", libOff)
			if got := s.Frame(addrs["lib_caller"]); got != wantLib {
				t.Errorf("lib_caller: got %q, want %q", got, wantLib)
			}
		})
	}
}

func TestUnmappedAndSpecial(t *testing.T) {
	maps := strings.Join([]string{
		"00400000-00401000 r-xp 00000000 08:01 1234 /nonexistent/dir/gone.so",
		"00500000-00501000 rw-p 00000000 00:00 0 [heap]",
		"00600000-00602000 r-xp 00000000 00:00 0 [vdso]",
		"00700000-00701000 rw-p 00000000 00:00 0",
		"00800000-00801000 r-xp 00001000 08:01 99 /tmp/with space/lib x.so (deleted)",
	}, "\n")
	s := New(maps)
	defer s.Close()
	cases := []struct {
		addr uint64
		want string
		mod  string
	}{
		{0x10, "0x10", ""},
		{0x401000, "0x401000", ""}, // end is exclusive
		{0x400123, "?? (gone.so+0x123)", "gone.so"},
		{0x500010, "?? ([heap]+0x10)", "[heap]"},
		{0x601234, "?? ([vdso]+0x1234)", "[vdso]"},
		{0x700010, "0x700010", ""},
		{0x800010, "?? (lib x.so+0x1010)", "lib x.so"},
		{^uint64(0), "0xffffffffffffffff", ""},
	}
	for _, c := range cases {
		if got := s.Frame(c.addr); got != c.want {
			t.Errorf("Frame(%#x) = %q, want %q", c.addr, got, c.want)
		}
		if got := s.Module(c.addr); got != c.mod {
			t.Errorf("Module(%#x) = %q, want %q", c.addr, got, c.mod)
		}
	}
}

// A stack ends at its first word that cannot be a return address (a walk
// through code without frame pointers read a data word as a frame): in a
// mapping without execute permission, below every mapping, or beyond the
// x86-64 user address space. Code no mapping holds between mappings
// (unloaded before the maps were read) stays.
func TestFramesEndAtData(t *testing.T) {
	s := New(strings.Join([]string{
		"00400000-00401000 r-xp 00000000 08:01 1234 /nonexistent/dir/gone.so",
		"00500000-00501000 rw-p 00000000 00:00 0 [heap]",
		"7ffc0000000-7ffc0021000 rw-p 00000000 00:00 0 [stack]",
	}, "\n"))
	defer s.Close()
	cases := []struct {
		addrs []uint64
		want  []string
	}{
		{[]uint64{0x400010, 0x900000, 0x400020}, []string{"?? (gone.so+0x10)", "0x900000", "?? (gone.so+0x20)"}},
		{[]uint64{0x400010, 0x7ffc0001000, 0x400020}, []string{"?? (gone.so+0x10)"}},
		{[]uint64{0x400010, 0x500010}, []string{"?? (gone.so+0x10)"}},
		{[]uint64{0x400010, 0x1388, 0x400020}, []string{"?? (gone.so+0x10)"}},
		{[]uint64{0x500010}, []string{}},
	}
	if runtime.GOARCH == "amd64" {
		cases = append(cases, struct {
			addrs []uint64
			want  []string
		}{[]uint64{0x400010, 0x1ff8000000000, 0x400020}, []string{"?? (gone.so+0x10)"}})
	}
	for _, c := range cases {
		if got := s.Frames(c.addrs); !slices.Equal(got, c.want) {
			t.Errorf("Frames(%#x) = %q, want %q", c.addrs, got, c.want)
		}
	}
}

func TestGarbage(t *testing.T) {
	inputs := []string{
		"",
		"\x00\x01\x02garbage\n\n   \n",
		"zzzz-yyyy r-xp 0 0 0 /bin/true",
		"1000-0800 r-xp 00000000 00:00 0 /bin/true", // end < start
		"1000-2000 r 0 0 0 x",
		"1000-2000",
		"1000-2000 r-xp 00000000 00:00",
		"ffffffffffffffff-ffffffffffffffff r-xp 0 0 0 /x",
		strings.Repeat("1-2 r-xp 0 0 0 /a\n", 100),
	}
	for _, in := range inputs {
		s := New(in)
		for _, a := range []uint64{0, 1, 0x1000, 0x1500, ^uint64(0)} {
			_ = s.Frame(a)
			_ = s.Module(a)
		}
		_ = s.Frames(nil)
		s.Close()
	}
}

// TestCorruptELF points mappings at truncated and garbled copies of a real
// ELF file: the result must degrade, never panic.
func TestCorruptELF(t *testing.T) {
	fx := buildFixture(t)
	orig, err := os.ReadFile(filepath.Join(fx.dir, "prog"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var files []string
	write := func(name string, data []byte) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	write("magic.so", []byte("\x7fELF\x02\x01\x01garbage garbage garbage"))
	write("empty.so", nil)
	write("trunc64.so", orig[:64])
	write("trunc4k.so", orig[:4096])
	write("trunc.so", orig[:len(orig)*2/3])
	// Random byte flips, everywhere and only in the debug sections.
	ef, err := elf.Open(filepath.Join(fx.dir, "prog"))
	if err != nil {
		t.Fatal(err)
	}
	var dbgLo, dbgHi uint64 = uint64(len(orig)), 0
	for _, sec := range ef.Sections {
		if strings.HasPrefix(sec.Name, ".debug_") {
			dbgLo, dbgHi = min(dbgLo, sec.Offset), max(dbgHi, sec.Offset+sec.Size)
		}
	}
	ef.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for k := 0; k < 40; k++ {
		g := append([]byte(nil), orig...)
		lo, hi := uint64(16), uint64(len(g))
		if k%2 == 1 && dbgHi > dbgLo {
			lo, hi = dbgLo, dbgHi
		}
		for j := 0; j < 1+k; j++ {
			g[lo+rng.Uint64N(hi-lo)] = byte(rng.Uint32())
		}
		write(fmt.Sprintf("garbled%d.so", k), g)
	}

	var b strings.Builder
	base := uint64(0x10000000)
	for i, p := range files {
		fmt.Fprintf(&b, "%x-%x r-xp 00000000 00:00 0 %s\n", base+uint64(i)<<24, base+uint64(i)<<24+0x100000, p)
	}
	s := New(b.String())
	defer s.Close()
	for i, p := range files {
		for _, off := range []uint64{0, 0x10, 0x1140, 0x1150, 0x1160, 0x1180, 0x11a0, 0x1234, 0xfffff} {
			addr := base + uint64(i)<<24 + off
			got := s.Frame(addr)
			if got == "" || s.Module(addr) != filepath.Base(p) {
				t.Errorf("%s: Frame = %q, Module = %q", p, got, s.Module(addr))
			}
		}
	}
}

// TestMany symbolizes every function of a generated shared library with
// several compile units and thousands of functions, and checks each frame.
func TestMany(t *testing.T) {
	f := buildFixture(t)
	const units, perUnit = 4, 500
	dir := filepath.Join(f.dir, "many")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"-g", "-O0", "-fPIC", "-shared", "-o", "libmany.so"}
	for u := 0; u < units; u++ {
		var b strings.Builder
		b.WriteString("/* generated */\n")
		for i := 0; i < perUnit; i++ {
			// Line 2+i of the file, so function u_i sits on line i+2.
			fmt.Fprintf(&b, "int f%d_%d(int x) { return x * %d + %d; }\n", u, i, i, u)
		}
		name := fmt.Sprintf("gen%d.c", u)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, name)
	}
	if err := run(dir, "gcc", args...); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libmany.so")
	st, err := os.Stat(lib)
	if err != nil {
		t.Fatal(err)
	}
	// One mapping of the whole file at offset 0: for a GNU ld shared object
	// the file offset of text equals its virtual address.
	const base = 0x7f0000000000
	s := New(fmt.Sprintf("%x-%x r-xp 00000000 08:01 1 %s\n", uint64(base), base+uint64(st.Size()), lib))
	defer s.Close()

	ef, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	re := regexp.MustCompile(`^f(\d+)_(\d+)$`)
	start := time.Now()
	n := 0
	for _, sy := range syms {
		m := re.FindStringSubmatch(sy.Name)
		if m == nil {
			continue
		}
		u, _ := strconv.Atoi(m[1])
		i, _ := strconv.Atoi(m[2])
		want := fmt.Sprintf("%s gen%d.c:%d (libmany.so)", sy.Name, u, i+2)
		// As return addresses: just inside, in the middle, just past the end.
		for _, d := range []uint64{1, sy.Size / 2, sy.Size} {
			n++
			if got := s.Frame(base + sy.Value + d); got != want {
				t.Fatalf("Frame(%s+%d) = %q, want %q", sy.Name, d, got, want)
			}
		}
	}
	if n != 3*units*perUnit {
		t.Fatalf("checked %d frames", n)
	}
	t.Logf("%d distinct frames in %v", n, time.Since(start))
}

func funcPC(fn any) uintptr { return reflect.ValueOf(fn).Pointer() }

// TestLookupRecovers forces a panic inside DWARF parsing (a unit without
// data) and checks that the module degrades to having no symbols.
func TestLookupRecovers(t *testing.T) {
	mod := &module{name: "x.so", loaded: true, elfData: &elfData{ok: true,
		syms: []symbol{{addr: 1, end: 100, sized: true, name: "fallback"}},
		dw:   &dwarfIndex{units: []*unit{{}}, ranges: []addrRange{{1, 100, 0}}}}}
	fn, file, line := mod.lookup(10)
	if fn != "" || file != "" || line != 0 || !mod.broken {
		t.Fatalf("lookup = %q %q %d, broken=%v", fn, file, line, mod.broken)
	}
}

// C++ names read from the symbol table (no debug info) are demangled.
func TestDemangled(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ not found")
	}
	dir := t.TempDir()
	src := `#include <cstdio>
namespace zoo {
__attribute__((noinline)) void *callee() { return __builtin_return_address(0); }
__attribute__((noinline)) void *leak_here(int) {
	void *r = callee();
	return r;
}
}
int main(int, char **argv) {
	FILE *out = fopen(argv[1], "w");
	fprintf(out, "ret %p\n", zoo::leak_here(1));
	fprintf(out, "MAPS\n");
	FILE *m = fopen("/proc/self/maps", "r");
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, m)) > 0) fwrite(buf, 1, n, out);
	fclose(m);
	fclose(out);
	return 0;
}
`
	if err := os.WriteFile(filepath.Join(dir, "p.cpp"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// No -g: the name comes from .dynsym (-rdynamic), mangled there.
	if err := run(dir, "g++", "-O0", "-fno-omit-frame-pointer", "-rdynamic", "p.cpp", "-o", "p"); err != nil {
		t.Fatal(err)
	}
	addrs, maps := runProg(t, filepath.Join(dir, "p"))
	s := New(maps)
	defer s.Close()
	if got := s.Frame(addrs["ret"]); !strings.HasPrefix(got, "zoo::leak_here(int) (p+0x") {
		t.Errorf("frame in zoo::leak_here: %q, want zoo::leak_here(int) (p+0x...)", got)
	}
}

// While KeepModules holds, Symbolizers of different processes share a
// library's symbols: the second finds them read, and names frames alike.
func TestKeepModulesShares(t *testing.T) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skip(err)
	}
	pc := uint64(funcPC(TestKeepModulesShares)) + 1
	release := KeepModules()
	a, b := New(string(maps)), New(string(maps))
	fa, fb := a.Frame(pc), b.Frame(pc)
	ma, mb := a.find(pc).mod, b.find(pc).mod
	if fa != fb || ma.elfData == nil || ma.elfData != mb.elfData {
		t.Fatalf("frames %q and %q, modules' data shared: %v", fa, fb, ma.elfData == mb.elfData)
	}
	release()
	c := New(string(maps))
	if fc := c.Frame(pc); fc != fa || c.find(pc).mod.elfData == ma.elfData {
		t.Fatalf("after release: %q, still shared", fc)
	}
}
