package tests

import (
	"encoding/binary"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"msmemscope/format"
	"msmemscope/spool"
	"msmemscope/trace"
)

// TestSafetyModes: every folder msmemscope creates is 0750 and every file
// 0640 (SPEC §8), even under umask 000, for a run with two traced images.
func TestSafetyModes(t *testing.T) {
	needBuild(t)
	bin := compile(t, "execchild.c", "")
	child := compile(t, "single.c", "")
	out := filepath.Join(t.TempDir(), "out", "nested")
	cmd := exec.Command("/bin/sh", "-c", `umask 000 && exec "$@"`, "sh", cliPath, "--output="+out, bin, child)
	cmd.Env = cliEnv()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	m := readManifest(t, out)
	if len(m.Processes) != 2 {
		t.Fatalf("want 2 traced processes, got %d", len(m.Processes))
	}
	dirs, files := 0, 0
	err := filepath.Walk(filepath.Dir(out), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		switch {
		case fi.IsDir():
			dirs++
			if fi.Mode().Perm() != 0o750 {
				t.Errorf("folder %s has mode %04o, want 0750", p, fi.Mode().Perm())
			}
		case fi.Mode().IsRegular():
			files++
			if fi.Mode().Perm() != 0o640 {
				t.Errorf("file %s has mode %04o, want 0640", p, fi.Mode().Perm())
			}
		default:
			t.Errorf("%s is neither a folder nor a regular file (%v)", p, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// out/.., out, 2 x (process folder, spool, dump, analysis); manifest, and
	// per process at least spool, process.json, maps, end.json, dump,
	// config.json, leaks report.
	if dirs < 10 || files < 15 {
		t.Errorf("only %d folders and %d files were checked", dirs, files)
	}
}

// refusedOutput runs a program with --output=out and requires the refusal of
// SPEC §8: exit 2, one line naming the folder and the reason, program not run.
func refusedOutput(t *testing.T, out string, want ...string) {
	t.Helper()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	r := runCLI(t, 30*time.Second, dir, "--output="+out, "/usr/bin/touch", marker)
	if r.Code != 2 {
		t.Fatalf("--output=%s: exit %d, want 2\n%s", out, r.Code, r.Stderr)
	}
	oneLineError(t, r, want...)
	if _, err := os.Stat(marker); err == nil {
		t.Error("the program ran despite the refused output folder")
	}
}

// TestSafetySymlinkOutput: an output folder that is a symbolic link is
// refused, and nothing is written where it points.
func TestSafetySymlinkOutput(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o750); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	refusedOutput(t, link, link, "symbolic link")
	if ents, _ := os.ReadDir(real); len(ents) != 0 {
		t.Errorf("files were written through the link: %v", ents)
	}
}

// TestSafetyWorldWritableOutput: an output folder others can write to is
// refused, and nothing is written in it.
func TestSafetyWorldWritableOutput(t *testing.T) {
	out := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(out, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o777); err != nil {
		t.Fatal(err)
	}
	refusedOutput(t, out, out, "writable by others")
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("files were written in the refused folder: %v", ents)
	}
}

// TestSafetyLongOrBadOutputPath: an --output path longer than 4096 bytes, or
// holding a control character, is refused with one line.
func TestSafetyLongOrBadOutputPath(t *testing.T) {
	base := t.TempDir()
	long := base + "/" + strings.Repeat("d/", 2100)
	refusedOutput(t, long, "--output", "4096")
	if _, err := os.Stat(filepath.Join(base, "d")); err == nil {
		t.Error("part of the too-long path was created")
	}
	refusedOutput(t, base+"/bad\nname", "--output", "newline")
	refusedOutput(t, base+"/bad\tname", "--output", "control character")
	if ents, _ := os.ReadDir(base); len(ents) != 0 {
		t.Errorf("refused paths left files behind: %v", ents)
	}
}

// TestSafetyNeverOverwrite: converting a capture again (--input, twice) writes
// new file names (dump, config, leak report) and leaves every existing file
// byte for byte as it was; a second run into the same output folder creates
// its own process folder and manifest and changes nothing of the first.
func TestSafetyNeverOverwrite(t *testing.T) {
	bin := compile(t, "single.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	mp := readManifest(t, out).main(t)
	before := snapshot(t, out)
	firstDump := fileHash(t, mp.Dump)
	for i := 1; i <= 2; i++ {
		r := runCLI(t, 60*time.Second, "", "--input="+mp.Folder)
		if r.Code != 0 {
			t.Fatalf("--input conversion %d: exit %d\n%s", i, r.Code, r.Stderr)
		}
		for _, pat := range []string{"dump/memscope_dump_*.csv", "analysis/leaks_*.csv", "config*.json"} {
			if ms, _ := filepath.Glob(filepath.Join(mp.Folder, pat)); len(ms) != 1+i {
				t.Errorf("after conversion %d: %d files match %s, want %d", i, len(ms), pat, 1+i)
			}
		}
	}
	after := snapshot(t, out)
	for p, h := range before {
		if after[p] != h {
			t.Errorf("%s changed", p)
		}
	}
	dumps, _ := filepath.Glob(filepath.Join(mp.Folder, "dump", "memscope_dump_*.csv"))
	for _, d := range dumps {
		if fileHash(t, d) != firstDump {
			t.Errorf("%s differs from the first dump of the same spool", d)
		}
	}

	mustRun(t, 0, out, bin)
	ms, _ := filepath.Glob(filepath.Join(out, "run_*.json"))
	folders, _ := filepath.Glob(filepath.Join(out, "msmemscope_*"))
	if len(ms) != 2 || len(folders) != 2 {
		t.Errorf("after a second run: %d manifests and %d process folders, want 2 and 2", len(ms), len(folders))
	}
	final := snapshot(t, out)
	for p, h := range after {
		if final[p] != h {
			t.Errorf("the second run changed %s", p)
		}
	}
}

// TestSafetyCorruptSpool: a corrupt spool given to --input is an error of one
// line with exit code != 0 -- no crash, no hang, no dump. Random byte flips
// inside the records never crash or hang either.
func TestSafetyCorruptSpool(t *testing.T) {
	bin := compile(t, "allocfns.c", "")
	out := filepath.Join(t.TempDir(), "out")
	mustRun(t, 0, out, bin)
	src := readManifest(t, out).main(t).Folder
	spool, err := os.ReadFile(filepath.Join(src, "spool", "spool.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(spool) < 200 {
		t.Fatalf("the spool has only %d bytes", len(spool))
	}
	// copyCapture copies the capture's spool folder (not its converted files)
	// with spool.bin replaced.
	copyCapture := func(t *testing.T, data []byte) string {
		dst := filepath.Join(t.TempDir(), "capture")
		if err := os.MkdirAll(filepath.Join(dst, "spool"), 0o750); err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(filepath.Join(src, "spool"))
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(src, "spool", e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if e.Name() == "spool.bin" {
				b = data
			}
			if err := os.WriteFile(filepath.Join(dst, "spool", e.Name()), b, 0o640); err != nil {
				t.Fatal(err)
			}
		}
		return dst
	}
	clone := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), spool...)) }
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"bad_magic", clone(func(b []byte) []byte { copy(b, "NOTSPOOL"); return b }), "bad header"},
		{"short_header", clone(func(b []byte) []byte { return b[:5] }), "bad header"},
		{"empty", nil, "bad header"},
		{"garbage_chunk_header", clone(func(b []byte) []byte {
			for i := 32; i < 48; i++ {
				b[i] = 0xff
			}
			return b
		}), "corrupt chunk header"},
		{"random", clone(func(b []byte) []byte { rand.New(rand.NewSource(1)).Read(b); return b }), "spool"},
		// Cut between two chunks: every chunk left is whole, but the
		// process ended normally with more (end.json says how much).
		{"cut_between_chunks", clone(func(b []byte) []byte {
			end := format.SpoolHdrSize + format.ChunkSize + int(binary.LittleEndian.Uint32(b[format.SpoolHdrSize+format.ChunkNUnitOff:]))*format.UnitSize
			if end >= len(b) {
				t.Fatalf("the spool has one chunk (%d bytes)", len(b))
			}
			return b[:end]
		}), "cut short"},
		{"header_only", clone(func(b []byte) []byte { return b[:format.SpoolHdrSize] }), "cut short"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyCapture(t, c.data)
			r := runCLI(t, 60*time.Second, "", "--input="+dir)
			if r.Code == 0 {
				t.Fatalf("exit 0 for a corrupt spool\n%s", r.Stderr)
			}
			oneLineError(t, r, "spool.bin", c.want)
			if ms, _ := filepath.Glob(filepath.Join(dir, "dump", "*.csv")); len(ms) != 0 {
				t.Errorf("a dump was written from a corrupt spool: %v", ms)
			}
		})
	}
	t.Run("byte_flips", func(t *testing.T) {
		rng := rand.New(rand.NewSource(7))
		for i := 0; i < 8; i++ {
			data := clone(func(b []byte) []byte {
				for j := 0; j < 16; j++ {
					b[32+rng.Intn(len(b)-32)] ^= byte(1 + rng.Intn(255))
				}
				return b
			})
			r := runCLI(t, 60*time.Second, "", "--input="+copyCapture(t, data))
			if r.Code != 0 && r.Code != 2 { // a damaged input: a usage error
				t.Errorf("flip set %d: exit %d\n%s", i, r.Code, r.Stderr)
			}
			for _, bad := range []string{"panic", "goroutine", "SIGSEGV"} {
				if strings.Contains(r.Stderr, bad) {
					t.Fatalf("flip set %d: crash:\n%s", i, r.Stderr)
				}
			}
		}
	})
}

// TestDiskReserveKept: when writing the dump would leave less free than the
// reserve (1 GiB or 5% of the file system; MSMEMSCOPE_DISK_RESERVE here),
// the conversion stops with one line, writes no dump, keeps the capture
// whole, and the program's exit code stands; converting again with room
// writes it.
func TestDiskReserveKept(t *testing.T) {
	bin := compile(t, "lk_tree.c", "")
	out := filepath.Join(t.TempDir(), "out")
	if err := os.MkdirAll(out, 0o750); err != nil {
		t.Fatal(err)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(out, &st); err != nil {
		t.Fatal(err)
	}
	free := st.Bavail * uint64(st.Bsize)
	r := runCLIEnv(t, 120*time.Second, "", []string{fmt.Sprintf("MSMEMSCOPE_DISK_RESERVE=%d", free+1<<30)}, "--output="+out, bin)
	if r.Code != 0 {
		t.Fatalf("exit %d, want the program's 0\n%s", r.Code, r.Stderr)
	}
	var stopped []string
	for _, l := range stderrLines(r.Stderr) {
		if strings.Contains(l, "stopped writing") {
			stopped = append(stopped, l)
		}
	}
	if len(stopped) != 1 || !strings.Contains(stopped[0], "MSMEMSCOPE_DISK_RESERVE") || !strings.Contains(stopped[0], "--input=") {
		t.Fatalf("want one line saying the dump was stopped and how to convert again:\n%s", r.Stderr)
	}
	folders, _ := filepath.Glob(filepath.Join(out, "msmemscope_*"))
	if len(folders) != 1 {
		t.Fatalf("capture folders %v", folders)
	}
	if dumps, _ := filepath.Glob(filepath.Join(folders[0], "dump", "*")); len(dumps) != 0 {
		t.Errorf("dump files written past the reserve: %v", dumps)
	}
	if _, err := os.Stat(filepath.Join(folders[0], "spool", "spool.bin")); err != nil {
		t.Fatalf("the capture is not kept: %v", err)
	}
	mustRun(t, 0, filepath.Join(t.TempDir(), "again"), "--input="+folders[0])
	if dumps, _ := filepath.Glob(filepath.Join(folders[0], "dump", "memscope_dump_*.csv")); len(dumps) != 1 {
		t.Errorf("converting again with room: dumps %v", dumps)
	}
}

// TestSpoolDiskFullThenFreed: the disk fills in the middle of a spool
// write and frees again later in the run (diskfull_shim.c). Writing on would
// leave a chunk cut short, and records read against lost ones, in the middle
// of the spool: the previous build's capture read as "corrupt chunk header"
// and converted to nothing. The spool is cut back to its last whole chunk and
// takes nothing more: it converts, said incomplete, to a prefix of the
// program's own pairs, nothing invented; the program's memory stays bounded.
func TestSpoolDiskFullThenFreed(t *testing.T) {
	shim := compile(t, "diskfull_shim.c", "", "-shared", "-fPIC", "-ldl")
	bin := compile(t, "diskfull.c", "")
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command(bin)
	cmd.Env = cliEnv("LD_PRELOAD="+shim+":"+filepath.Join(libDir, "libmemscope.so"), `MSMEMSCOPE_CONFIG={"output":"`+out+`","analysis":[]}`)
	b, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(b), "writing the spool failed (no space left on the device)") {
		t.Fatalf("the run: %v\n%s", err, b)
	}
	// The rings are still drained (what they hold dropped): a drain that
	// stopped at a ring it could not release (the thread that ended while
	// the disk was full) left the 4 M pairs after it in memory, 47 MB.
	var rss int
	_, after, _ := strings.Cut(string(b), "peak_rss_kb ")
	if _, err := fmt.Sscan(after, &rss); err != nil || rss > 32<<10 {
		t.Errorf("the program's peak RSS: %d KiB (%v), want under 32 MiB\n%s", rss, err, b)
	}
	dirs, _ := filepath.Glob(filepath.Join(out, "msmemscope_*"))
	if len(dirs) != 1 {
		t.Fatalf("captures: %v", dirs)
	}
	r := runCLI(t, 60*time.Second, "", "--input="+dirs[0], "--analysis=")
	if r.Code != 0 || !strings.Contains(r.Stderr, "incomplete: writes to the spool failed") {
		t.Fatalf("--input of the capture: exit %d\n%s", r.Code, r.Stderr)
	}
	dumps, _ := filepath.Glob(filepath.Join(dirs[0], "dump", "memscope_dump_*.csv"))
	if len(dumps) == 0 {
		t.Fatalf("no dump in %s", dirs[0])
	}
	pairs, open := 0, false
	var at uint64
	scanDump(t, dumps[len(dumps)-1], true, func(e *trace.Event) {
		if e.Type != trace.TypeHost {
			return
		}
		want := uint64(100 + pairs%200) // the program's pairs, in order
		switch {
		case e.Kind == trace.KindMalloc && !open && e.Size == want:
			open, at = true, e.Ptr
		case e.Kind == trace.KindFree && open && e.Ptr == at && e.Size == want:
			open = false
			pairs++
		default:
			t.Fatalf("row %d: %s of %d B at %#x after %d pairs: not the program's next", e.ID, e.Kind, e.Size, e.Ptr, pairs)
		}
	})
	// The disk filled once 32 KiB of the first 100 rounds were in the
	// spool, and it took none of what followed it freeing again.
	if pairs < 1000 || pairs > 150*200 {
		t.Errorf("%d pairs in the capture, want at least 1,000 (32 KiB of spool) and at most the 30,000 before the disk freed", pairs)
	}
}

// TestSpoolWriteFailureSaid: when the spool cannot take more (a full disk;
// here a file size limit, which needs no mount, with SIGXFSZ ignored as the
// program's: the library preloaded, as the CLI does), the run says so once,
// as it happens, instead of ending short without a word.
func TestSpoolWriteFailureSaid(t *testing.T) {
	bin := compile(t, "threads.c", "")
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command("/bin/sh", "-c", `ulimit -f 256; trap "" XFSZ; exec "$0" "$@"`, bin)
	cmd.Env = cliEnv("LD_PRELOAD="+filepath.Join(libDir, "libmemscope.so"), `MSMEMSCOPE_CONFIG={"output":"`+out+`"}`)
	b, _ := cmd.CombinedOutput()
	said := strings.Count(string(b), "writing the spool failed (file size limit exceeded): events are being lost")
	if said != 1 {
		t.Fatalf("the spool's failed writes said %d times, want once:\n%s", said, b)
	}
	for _, bad := range []string{"panic", "goroutine", "SIGSEGV"} {
		if strings.Contains(string(b), bad) {
			t.Fatalf("crash:\n%s", b)
		}
	}
	// Converted again: what the spool holds, said incomplete, and no exit
	// leak invented from the frees it misses. (The shell's image, which
	// exec'd the program, has a capture of its own.)
	dir := captureOf(t, out, bin)
	r := runCLI(t, 60*time.Second, "", "--input="+dir)
	if r.Code != 0 || !strings.Contains(r.Stderr, "incomplete: writes to the spool failed") || !strings.Contains(r.Stderr, "exit leaks not known") {
		t.Fatalf("--input of the capture: exit %d\n%s", r.Code, r.Stderr)
	}
}

// TestRotatedLogWriteFailureSaid: the same with rotating logs (a log past
// the file size limit). The failure was counted without a word, and the
// failed write's bytes were left in the log (a frame cut short, on a full
// disk the room end.json needed): it is said once, the log is cut back to
// its last whole frame, and the capture converts, said incomplete.
func TestRotatedLogWriteFailureSaid(t *testing.T) {
	bin := compile(t, "threads.c", "")
	out := filepath.Join(t.TempDir(), "out")
	cmd := exec.Command("/bin/sh", "-c", `ulimit -f 256; trap "" XFSZ; exec "$0" "$@"`, bin)
	cmd.Env = cliEnv("LD_PRELOAD="+filepath.Join(libDir, "libmemscope.so"),
		`MSMEMSCOPE_CONFIG={"output":"`+out+`","log_mode":"rotate","log_files":4,"log_file_mb":1}`, "MSMEMSCOPE_HOOK=rotate=1")
	b, _ := cmd.CombinedOutput()
	if said := strings.Count(string(b), "writing the rotated logs failed ("); said != 1 {
		t.Fatalf("the logs' failed writes said %d times, want once:\n%s", said, b)
	}
	dir := captureOf(t, out, bin)
	for _, l := range spool.LogFiles(dir) {
		if _, err := spool.OpenWholeLog(l); err != nil {
			t.Errorf("a log is not whole frames: %v", err)
		}
	}
	r := runCLI(t, 60*time.Second, "", "--input="+dir, "--analysis=")
	if r.Code != 0 || !strings.Contains(r.Stderr, "incomplete: writes to the spool failed") || !strings.Contains(r.Stderr, "of the rotated logs' writes failed during the run") {
		t.Fatalf("--input of the capture: exit %d\n%s", r.Code, r.Stderr)
	}
}

// captureOf is the one capture in out of the program bin (a shell that
// exec'd it has one of its own).
func captureOf(t *testing.T, out, bin string) string {
	t.Helper()
	all, _ := filepath.Glob(filepath.Join(out, "msmemscope_*"))
	var dirs []string
	for _, d := range all {
		if m, err := spool.ReadMeta(d); err == nil && m.Exe == bin {
			dirs = append(dirs, d)
		}
	}
	if len(dirs) != 1 {
		t.Fatalf("captures: %v, of the program: %v", all, dirs)
	}
	return dirs[0]
}
