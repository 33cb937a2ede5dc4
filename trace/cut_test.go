package trace

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// Dumps cut short: every cut of a real dump is an error naming the file,
// never a panic and never a success with other rows, except a cut exactly at
// a row boundary of a CSV outside its capture folder (it reads as the rows
// before it); beside its config.json even that is an error.

// cutDump is a dump CSV of the writer, with rows of every shape: quoted
// Attr, quoted names and stacks, a field over several lines.
func cutDump(t testing.TB) ([]byte, []Event) {
	evs := append(sampleEvents(), manyEvents(300)...)
	for i := range evs {
		evs[i].ID = uint64(i + 1)
	}
	return writeCSV(t, evs), evs
}

// rowEnds are the offsets just past each record's line end (the header's
// first): a '\n' outside quotes (the writer doubles quotes inside a field).
func rowEnds(data []byte) []int {
	var ends []int
	quoted := false
	for i, c := range data {
		switch {
		case c == '"':
			quoted = !quoted
		case c == '\n' && !quoted:
			ends = append(ends, i+1)
		}
	}
	return ends
}

// cutOffsets are 200 seeded random offsets, every offset of the last 64
// bytes and every row boundary, sorted, without the file's full size.
func cutOffsets(size int, ends []int) []int {
	rng := rand.New(rand.NewSource(16))
	seen := map[int]bool{}
	for range 200 {
		seen[rng.Intn(size)] = true
	}
	for o := max(0, size-64); o < size; o++ {
		seen[o] = true
	}
	for _, e := range ends {
		if e < size {
			seen[e] = true
		}
	}
	var out []int
	for o := range seen {
		out = append(out, o)
	}
	sort.Ints(out)
	return out
}

// readCut opens and reads path, turning a panic into a test failure.
func readCut(t *testing.T, path string, opt OpenOptions) (evs []Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("%s: panic: %v", path, r)
		}
	}()
	in, err := Open(path, opt)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	return readInput(t, in)
}

func TestCSVCutAnywhere(t *testing.T) {
	data, _ := cutDump(t)
	ends := rowEnds(data)
	dir := t.TempDir()
	capture := filepath.Join(dir, "msmemscope_1_20260101000000")
	os.MkdirAll(filepath.Join(capture, "dump"), 0o750)
	alone := filepath.Join(dir, "memscope_dump_20260101000000.csv")
	inCapture := filepath.Join(capture, "dump", "memscope_dump_20260101000000.csv")
	cfg := fmt.Sprintf(`{"version":"x","events_written":%d,"events_lost":0}`, len(ends)-1)
	os.WriteFile(filepath.Join(capture, "config.json"), []byte(cfg), 0o640)

	for _, mapped := range []bool{false, true} {
		saved, savedChunk := csvMapMin, csvChunkSize
		if mapped { // the mmap path, in chunks of several rows
			csvMapMin, csvChunkSize = 1, 4096
		}
		full := map[string][]Event{}
		for _, p := range []string{alone, inCapture} {
			os.WriteFile(p, data, 0o640)
			evs, err := readCut(t, p, OpenOptions{})
			if err != nil || len(evs) != len(ends)-1 {
				t.Fatalf("%s whole: %d rows, %v", p, len(evs), err)
			}
			full[p] = evs
		}
		for _, off := range cutOffsets(len(data), ends) {
			boundary := sort.SearchInts(ends, off)
			atBoundary := boundary < len(ends) && ends[boundary] == off
			for _, p := range []string{alone, inCapture} {
				os.WriteFile(p, data[:off], 0o640)
				evs, err := readCut(t, p, OpenOptions{})
				if atBoundary && p == alone {
					if want := full[p][:boundary]; err != nil || len(evs) != len(want) || (len(want) > 0 && !reflect.DeepEqual(evs, want)) {
						t.Errorf("mapped %v: cut at row boundary %d (%d rows): %d rows, %v", mapped, off, boundary, len(evs), err)
					}
					continue
				}
				switch {
				case err == nil:
					t.Errorf("mapped %v: %s cut at %d of %d: read %d rows without an error", mapped, p, off, len(data), len(evs))
				case !strings.Contains(err.Error(), p):
					t.Errorf("mapped %v: cut at %d: the error does not name the file: %v", mapped, off, err)
				case off > 0 && !strings.HasSuffix(err.Error(), "(the file is cut short or damaged)"):
					t.Errorf("mapped %v: cut at %d: the error does not say the file is cut short: %v", mapped, off, err)
				case strings.ContainsAny(err.Error(), "\n\r"):
					t.Errorf("mapped %v: cut at %d: the error is not one line: %q", mapped, off, err)
				}
			}
		}
		csvMapMin, csvChunkSize = saved, savedChunk
	}

	// The rows are counted whatever the reader keeps: a cut at a row
	// boundary of the capture's dump is found with Kinds and Lean too.
	os.WriteFile(inCapture, data[:ends[len(ends)/2]], 0o640)
	_, err := readCut(t, inCapture, OpenOptions{Lean: true, Kinds: []Kind{KindMstx}})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("but %s says events_written %d", filepath.Join(capture, "config.json"), len(ends)-1)) {
		t.Errorf("a cut capture dump read for its MSTX rows: %v", err)
	}
}

// A config.json belongs to the dump its conversion wrote: config_{key}.json
// to memscope_dump_{key}, config.json to the only other one.
func TestDumpConfigPairing(t *testing.T) {
	data, _ := cutDump(t)
	rows := len(rowEnds(data)) - 1
	capture := filepath.Join(t.TempDir(), "msmemscope_1_20260101000000")
	os.MkdirAll(filepath.Join(capture, "dump"), 0o750)
	first := filepath.Join(capture, "dump", "memscope_dump_20260101000001.csv")
	second := filepath.Join(capture, "dump", "memscope_dump_20260101000002.csv")
	half := data[:rowEnds(data)[rows/2]]
	os.WriteFile(first, data, 0o640)
	os.WriteFile(second, half, 0o640)
	write := func(name string, n int) {
		os.WriteFile(filepath.Join(capture, name), fmt.Appendf(nil, `{"events_written":%d}`, n), 0o640)
	}
	write("config.json", rows)
	// Two dumps, one config: config.json cannot be told to be either's.
	for _, p := range []string{first, second} {
		if _, err := readCut(t, p, OpenOptions{}); err != nil {
			t.Errorf("%s with an ambiguous config.json: %v", p, err)
		}
	}
	write("config_20260101000002.json", rows) // second's config says more rows
	if _, err := readCut(t, first, OpenOptions{}); err != nil {
		t.Errorf("first conversion's dump: %v", err)
	}
	if _, err := readCut(t, second, OpenOptions{}); err == nil || !strings.Contains(err.Error(), "config_20260101000002.json says events_written") {
		t.Errorf("second conversion's dump, cut: %v", err)
	}
	// The same rows in the other format share the key, and config.json.
	db := strings.TrimSuffix(first, ".csv") + ".db"
	evs, _ := readCut(t, first, OpenOptions{})
	writeDB(t, db, evs)
	if _, err := readCut(t, db, OpenOptions{}); err != nil {
		t.Errorf("the DB copy of the first dump: %v", err)
	}
	write("config.json", rows+1)
	if _, err := readCut(t, db, OpenOptions{Kinds: []Kind{KindMalloc}}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%d rows, but", rows)) {
		t.Errorf("a DB with fewer rows than config.json says: %v", err)
	}
}

// A database cut anywhere, or with bytes flipped, is an error naming the file
// (a cut) or either reads or fails naming it (a flip: SQLite has no
// checksums, a flipped digit in a value is another value), never a panic.
func TestSQLiteCutAndFlipped(t *testing.T) {
	_, evs := cutDump(t)
	dir := t.TempDir()
	whole := filepath.Join(dir, "whole.db")
	writeDB(t, whole, evs)
	data, err := os.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "memscope_dump_1.db")
	var offs []int
	for o := 0; o < len(data); o += 4096 { // at page boundaries
		offs = append(offs, o)
	}
	rng := rand.New(rand.NewSource(16))
	for range 40 {
		offs = append(offs, rng.Intn(len(data)))
	}
	offs = append(offs, 10, 50, 99, 100, 101, len(data)-1)
	for _, off := range offs {
		os.WriteFile(p, data[:off], 0o640)
		got, err := readCut(t, p, OpenOptions{})
		if err == nil {
			t.Errorf("DB cut at %d of %d: read %d rows without an error", off, len(data), len(got))
		} else if !strings.Contains(err.Error(), p) || strings.ContainsAny(err.Error(), "\n\r") {
			t.Errorf("DB cut at %d: %q does not name the file on one line", off, err)
		}
	}
	for i := range 60 {
		b := bytes.Clone(data)
		off := rng.Intn(len(b))
		if i < 20 {
			off = 100 + rng.Intn(min(4096, len(b))-100) // the first page: the schema
		}
		b[off] ^= byte(1 + rng.Intn(255))
		os.WriteFile(p, b, 0o640)
		_, err := readCut(t, p, OpenOptions{})
		if err != nil && (!strings.Contains(err.Error(), p) || strings.ContainsAny(err.Error(), "\n\r")) {
			t.Errorf("DB with byte %d flipped: %q does not name the file on one line", off, err)
		}
	}
}
