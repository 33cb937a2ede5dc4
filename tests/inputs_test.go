package tests

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// inputCase is a CLI command on a damaged input and what its error names.
type inputCase struct {
	name string
	args []string
	want []string
}

// TestDamagedInputsExit2: a dump, spool or rotated log cut short or damaged,
// given back to --input (with --analysis), --timeline or --compare, is one
// error line naming the file, exit 2 (a usage error), never a crash and never
// a report from part of the file.
func TestDamagedInputsExit2(t *testing.T) {
	bin := compile(t, "single.c", "")
	tmp := t.TempDir()
	csvOut, dbOut := filepath.Join(tmp, "csv"), filepath.Join(tmp, "db")
	mustRun(t, 0, csvOut, bin)
	mustRun(t, 0, dbOut, "--data-format=db", bin)
	capture := readManifest(t, csvOut).main(t).Folder
	dump := onlyFile(t, filepath.Join(capture, "dump", "memscope_dump_*.csv"))
	db := onlyFile(t, filepath.Join(readManifest(t, dbOut).main(t).Folder, "dump", "memscope_dump_*.db"))
	csvData, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	dbData, _ := os.ReadFile(db)
	spoolData, _ := os.ReadFile(filepath.Join(capture, "spool", "spool.bin"))
	write := func(name string, b []byte) string {
		p := filepath.Join(tmp, name)
		if err := os.WriteFile(p, b, 0o640); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The capture's dump cut at a row boundary: only config.json can tell.
	lines := bytes.SplitAfter(csvData, []byte("\n"))
	boundary := bytes.Join(lines[:len(lines)/2], nil)
	if err := os.WriteFile(dump, boundary, 0o640); err != nil {
		t.Fatal(err)
	}
	header := lines[0]
	cases := []inputCase{
		{"csv cut in its last field", []string{"--analysis=leaks", "--input=" + write("a.csv", csvData[:len(csvData)-2])}, []string{"a.csv:", "cut short"}},
		{"csv cut mid-row", []string{"--analysis=decompose", "--input=" + write("b.csv", csvData[:len(csvData)/2+7])}, []string{"b.csv:", "cut short"}},
		{"timeline of a cut csv", []string{"--timeline", "--input=" + write("c.csv", csvData[:len(csvData)-1])}, []string{"c.csv:", "cut short"}},
		{"timeline of a header", []string{"--timeline", "--input=" + write("d.csv", header)}, []string{"d.csv", "no events"}},
		{"dump cut at a row boundary", []string{"--analysis=leaks", "--input=" + dump}, []string{dump, "config.json says events_written"}},
		{"timeline of a dump cut at a row boundary", []string{"--timeline", "--input=" + dump}, []string{dump, "events_written"}},
		{"compare with a cut csv", []string{"--compare", "--input=" + write("e.csv", csvData[:len(csvData)-3]) + "," + write("f.csv", csvData)}, []string{"e.csv:", "cut short"}},
		{"db cut short", []string{"--analysis=leaks", "--input=" + write("g.db", dbData[:len(dbData)/2])}, []string{"g.db", "cut short"}},
		{"timeline of a db cut short", []string{"--timeline", "--input=" + write("h.db", dbData[:len(dbData)-4096])}, []string{"h.db", "cut short"}},
		{"spool cut short", []string{"--analysis=leaks", "--input=" + write("i.bin", spoolData[:len(spoolData)-100])}, []string{"i.bin", "cut short"}},
		{"timeline of a spool cut short", []string{"--timeline", "--input=" + write("j.bin", spoolData[:len(spoolData)-100])}, []string{"j.bin", "cut short"}},
		{"garbage spool", []string{"--timeline", "--input=" + write("k.bin", append(spoolData[:64:64], bytes.Repeat([]byte{0xa5}, 4096)...))}, []string{"k.bin", "damaged chunk at byte 32"}},
	}
	// A rotating capture that ended, its log cut: converted again, and the
	// log alone under --timeline.
	rotOut := filepath.Join(tmp, "rot")
	mustRun(t, 0, rotOut, "--log-mode=rotate", "--log-files=2", "--log-file-mb=1", bin)
	rot := readManifest(t, rotOut).main(t).Folder
	log := onlyFile(t, filepath.Join(rot, "spool", "log_*.zst"))
	logData, _ := os.ReadFile(log)
	if err := os.WriteFile(log, logData[:len(logData)/2], 0o640); err != nil {
		t.Fatal(err)
	}
	// A rotating capture with a log missing, between two (the rotation
	// deletes the oldest only) or all of them (end.json names the newest).
	gapOut := filepath.Join(tmp, "gap")
	mustRun(t, 0, gapOut, "--log-mode=rotate", "--log-files=2", "--log-file-mb=1", bin)
	gap := readManifest(t, gapOut).main(t).Folder
	gapLog := onlyFile(t, filepath.Join(gap, "spool", "log_*.zst"))
	gapData, _ := os.ReadFile(gapLog)
	if err := os.WriteFile(filepath.Join(gap, "spool", "log_000009.zst"), gapData, 0o640); err != nil {
		t.Fatal(err)
	}
	// A rotating capture with two logs swapped: named as read, each holds
	// another's number (read in name order they gave blocks freed as live).
	swapOut := filepath.Join(tmp, "swap")
	mustRun(t, 0, swapOut, "--log-mode=rotate", "--log-files=2", "--log-file-mb=1", bin)
	swap := readManifest(t, swapOut).main(t).Folder
	swapLog := onlyFile(t, filepath.Join(swap, "spool", "log_*.zst"))
	swapped := filepath.Join(swap, "spool", "log_000002.zst") // the newest log's next number
	if err := os.Rename(swapLog, swapped); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(swapLog, gapData, 0o640); err != nil { // another capture's log 1
		t.Fatal(err)
	}
	noneOut := filepath.Join(tmp, "nologs")
	mustRun(t, 0, noneOut, "--log-mode=rotate", "--log-files=2", "--log-file-mb=1", bin)
	none := readManifest(t, noneOut).main(t).Folder
	if err := os.Remove(onlyFile(t, filepath.Join(none, "spool", "log_*.zst"))); err != nil {
		t.Fatal(err)
	}
	// A capture whose process.json is damaged (its dump is there): said,
	// not analysed from the dump without its spool's leak kinds.
	damaged := filepath.Join(tmp, "damaged")
	mustRun(t, 0, damaged, bin)
	dmg := readManifest(t, damaged).main(t).Folder
	if err := os.WriteFile(filepath.Join(dmg, "spool", "process.json"), []byte("garbage{"), 0o640); err != nil {
		t.Fatal(err)
	}
	// (and one whose process.json is valid JSON without a pid)
	empty := filepath.Join(tmp, "empty")
	mustRun(t, 0, empty, bin)
	emp := readManifest(t, empty).main(t).Folder
	if err := os.WriteFile(filepath.Join(emp, "spool", "process.json"), []byte("{}"), 0o640); err != nil {
		t.Fatal(err)
	}
	// A capture whose spool has one byte flipped inside the first chunk's
	// units (a damaged disk): said, not converted into other events.
	flipOut := filepath.Join(tmp, "flip")
	mustRun(t, 0, flipOut, bin)
	flip := readManifest(t, flipOut).main(t).Folder
	flipSpool := filepath.Join(flip, "spool", "spool.bin")
	flipped, _ := os.ReadFile(flipSpool)
	const hdr, chunkHdr = 32, 16
	if len(flipped) < hdr+chunkHdr+24 || string(flipped[hdr:hdr+4]) != "CHNK" || binary.LittleEndian.Uint32(flipped[hdr+4:]) < 3 {
		t.Fatalf("the spool does not begin with a chunk of 3 units or more: % x", flipped[:min(len(flipped), 64)])
	}
	flipped[hdr+chunkHdr+17] ^= 0x10 // the third unit's second byte
	if err := os.WriteFile(flipSpool, flipped, 0o640); err != nil {
		t.Fatal(err)
	}
	cases = append(cases,
		inputCase{"capture whose spool has a damaged byte", []string{"--input=" + flip}, []string{"damaged chunk at byte 32"}},
		inputCase{"spool file with a damaged byte", []string{"--analysis=leaks", "--input=" + write("l.bin", flipped)}, []string{"l.bin", "damaged chunk at byte 32"}},
		inputCase{"capture with a damaged process.json", []string{"--input=" + dmg}, []string{dmg, "the capture is damaged", "process.json"}},
		inputCase{"timeline of a capture with a damaged process.json", []string{"--timeline", "--input=" + dmg}, []string{dmg, "damaged"}},
		inputCase{"output folder holding a damaged capture", []string{"--input=" + damaged}, []string{dmg, "damaged"}},
		inputCase{"spool file of a damaged capture", []string{"--input=" + filepath.Join(dmg, "spool", "spool.bin")}, []string{dmg, "damaged"}},
		inputCase{"capture whose process.json has no pid", []string{"--input=" + emp}, []string{emp, "damaged", "no process id"}},
		inputCase{"rotating capture with a cut log", []string{"--input=" + rot}, []string{log, "cut short"}},
		inputCase{"rotating capture with a log missing between two", []string{"--input=" + gap}, []string{"log_000002.zst is missing"}},
		inputCase{"rotating capture with its logs missing", []string{"--input=" + none}, []string{"rotated logs are missing"}},
		inputCase{"rotating capture with a log renamed", []string{"--input=" + swap}, []string{swapped, "holds log 1", "renamed or copied"}},
		inputCase{"timeline of a cut log alone", []string{"--timeline", "--input=" + write("log_000009.zst", logData[:len(logData)-9])}, []string{"log_000009.zst", "cut short"}})
	// A FIFO: refused before it is opened (the open blocked for good).
	fifo := filepath.Join(tmp, "fifo")
	if err := syscall.Mkfifo(fifo, 0o640); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--input=" + fifo}, {"--timeline", "--input=" + fifo}, {"--compare", "--input=" + fifo + "," + dump}} {
		cases = append(cases, inputCase{"a FIFO: " + strings.Join(args, " "), args, []string{fifo, "not a regular file"}})
	}
	for _, c := range cases {
		r := runCLI(t, 60*time.Second, tmp, append([]string{"--output=" + filepath.Join(tmp, "reports")}, c.args...)...)
		if r.Code != 2 {
			t.Errorf("%s: exit %d, want 2\n%s", c.name, r.Code, r.Stderr)
			continue
		}
		oneLineError(t, r, c.want...)
	}
	// A capture whose end.json is damaged: converted as a run that did not
	// end normally, said (it was without a word).
	endOut := filepath.Join(tmp, "end")
	mustRun(t, 0, endOut, bin)
	endCap := readManifest(t, endOut).main(t).Folder
	if err := os.WriteFile(filepath.Join(endCap, "spool", "end.json"), []byte("{garbage"), 0o640); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, 60*time.Second, tmp, "--input="+endCap); r.Code != 0 || !strings.Contains(r.Stderr, "end.json cannot be read (damaged)") || !strings.Contains(r.Stderr, "did not end normally") {
		t.Errorf("--input of a capture with a damaged end.json: exit %d\n%s", r.Code, r.Stderr)
	}
	// An output folder where one capture of two is damaged: the other is
	// converted, the damaged one left out with a warning.
	mixed := filepath.Join(tmp, "mixed")
	mustRun(t, 0, mixed, bin)
	first := readManifest(t, mixed).main(t).Folder
	mustRun(t, 0, mixed, bin)
	if err := os.WriteFile(filepath.Join(first, "spool", "process.json"), []byte("garbage{"), 0o640); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, 60*time.Second, tmp, "--input="+mixed); r.Code != 0 || !strings.Contains(r.Stderr, "left out") || !strings.Contains(r.Stderr, first) {
		t.Errorf("--input of an output folder with one damaged capture of two: exit %d\n%s", r.Code, r.Stderr)
	}
}
