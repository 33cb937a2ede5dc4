package trace

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// ineffDump is a dump with awkward rows (quotes, commas and line ends in
// fields, results already there) and results for some of its MALLOC rows:
// row 4 holds its result already, so it stays as it is.
func ineffDump(crlf bool) ([]byte, []IneffMark) {
	evs := append(sampleEvents(), manyEvents(4000)...)
	for i := 0; i < 300; i++ {
		e := manyEvents(1)[0]
		e.Type, e.Owner = TypePTA, "PTA@model@weight"
		e.Name = `op "x", y`
		e.PyStack = `a.py:1(f);b.py:2("g", h)`
		e.CStack = "f\nline two\r\n;g"
		if i%3 == 0 {
			e.Inefficient = "late_deallocation"
		}
		evs = slices.Insert(evs, 20+i*13, e)
	}
	var marks []IneffMark
	for i := range evs {
		e := &evs[i]
		e.ID = uint64(i + 1)
		if e.Kind != KindMalloc {
			continue
		}
		switch {
		case e.ID == 4:
			marks = append(marks, IneffMark{e.ID, []string{"temporary_idleness"}})
		case e.ID%7 == 0:
			marks = append(marks, IneffMark{e.ID, []string{"late_deallocation"}})
		case e.ID%11 == 0:
			marks = append(marks, IneffMark{e.ID, []string{"early_allocation", "temporary_idleness"}})
		}
	}
	var buf bytes.Buffer
	w := NewCSVWriter(&buf)
	for i := range evs {
		w.Write(&evs[i])
	}
	w.Flush()
	if crlf {
		return bytes.ReplaceAll(buf.Bytes(), []byte("\n"), []byte("\r\n")), marks
	}
	return buf.Bytes(), marks
}

// mallocOffsets reads where each MALLOC row starts, as an analysis does.
func mallocOffsets(t *testing.T, p string) (ids []uint64, offs map[uint64]int64) {
	t.Helper()
	in, err := Open(p, OpenOptions{Lean: true, Reuse: true, IndexMallocs: true, Kinds: []Kind{KindMalloc}})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	offs = map[uint64]int64{}
	for {
		e, err := in.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e == nil {
			return ids, offs
		}
		if in.Offset() < 0 {
			t.Fatalf("MALLOC row %d: no offset", e.ID)
		}
		ids = append(ids, e.ID)
		offs[e.ID] = in.Offset()
	}
}

// waitCopied waits until w's copy has got to off.
func waitCopied(t *testing.T, w *IneffWriter, off int64) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		if done, _ := w.Progress(); done >= off {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the copy did not get to %d", off)
		}
	}
}

// An IneffWriter writes the file AddInefficient writes, byte for byte,
// however the analysis tells it the results: all at the end, as it reads,
// with wrong guesses (the copy undone), with offsets that do not match.
func TestIneffWriterMatchesAddInefficient(t *testing.T) {
	defer func(n int64) { writebackPiece = n }(writebackPiece)
	writebackPiece = 4096 // several pieces, each written back
	for _, crlf := range []bool{false, true} {
		dir := t.TempDir()
		data, marks := ineffDump(crlf)
		ref := writeFile(t, dir, "ref.csv", data)
		ids, offs := mallocOffsets(t, ref)
		wantN, err := AddInefficient(ref, marks, nil)
		if err != nil || wantN == 0 {
			t.Fatalf("AddInefficient: %d, %v", wantN, err)
		}
		want, _ := os.ReadFile(ref)
		byID := map[uint64]IneffMark{}
		for _, m := range marks {
			byID[m.ID] = m
		}
		rng := rand.New(rand.NewSource(1))
		scenarios := map[string]func(w *IneffWriter){
			"at the end": func(w *IneffWriter) {
				for _, i := range rng.Perm(len(marks)) {
					w.Add(offs[marks[i].ID], marks[i])
				}
			},
			// As an analysis: rows final a few rows back, results pinned
			// when found and added later; some found late (wrong guesses).
			"streaming": func(w *IneffWriter) {
				later := map[int][]IneffMark{}
				for i, id := range ids {
					if i >= 5 {
						w.Final(offs[ids[i-5]])
					}
					if m, ok := byID[id]; ok {
						switch rng.Intn(4) {
						case 0:
							w.Add(offs[id], m)
						case 1, 2:
							w.Pin(offs[id])
							k := i + 1 + rng.Intn(30)
							later[k] = append(later[k], m)
						default: // found after the copy may have passed it
							k := i + 10 + rng.Intn(30)
							later[k] = append(later[k], m)
						}
					}
					for _, m := range later[i] {
						w.Add(offs[m.ID], m)
					}
					delete(later, i)
				}
				for _, ms := range later {
					for _, m := range ms {
						w.Add(offs[m.ID], m)
					}
				}
			},
			"undone": func(w *IneffWriter) {
				w.Add(offs[marks[0].ID], marks[0])
				last := offs[ids[len(ids)-1]]
				w.Final(last)
				waitCopied(t, w, last)
				w.Pin(offs[marks[1].ID])  // back to here
				w.Final(int64(len(data))) // ignored after a wrong guess
				for _, i := range rng.Perm(len(marks) - 1) {
					w.Add(offs[marks[i+1].ID], marks[i+1])
				}
			},
			"stale": func(w *IneffWriter) {
				for i, m := range marks {
					switch i {
					case 3:
						w.Add(offs[m.ID]+1, m)
					case 4:
						w.Add(-1, m)
					default:
						w.Add(offs[m.ID], m)
					}
				}
			},
		}
		for name, drive := range scenarios {
			p := writeFile(t, dir, "got.csv", data)
			w := NewIneffWriter(p)
			drive(w)
			n, err := w.Commit()
			w.Abort() // a no-op after Commit
			if err != nil || n != wantN {
				t.Fatalf("crlf=%v %s: added %d, %v; want %d", crlf, name, n, err, wantN)
			}
			if w.scanned != (name == "stale") {
				t.Fatalf("crlf=%v %s: scanned the file: %v", crlf, name, w.scanned)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, want) {
				t.Fatalf("crlf=%v %s: the file differs from AddInefficient's", crlf, name)
			}
			if tmp, _ := filepath.Glob(filepath.Join(dir, ".got.csv*")); len(tmp) != 0 {
				t.Fatalf("crlf=%v %s: temporary files left: %v", crlf, name, tmp)
			}
		}

		// Nothing new: the file is left alone.
		st, _ := os.Stat(ref)
		_, refOffs := mallocOffsets(t, ref)
		w := NewIneffWriter(ref)
		for _, m := range marks {
			w.Add(refOffs[m.ID], m)
		}
		if n, err := w.Commit(); err != nil || n != 0 || w.scanned {
			t.Fatalf("nothing new: %d, %v (scanned: %v)", n, err, w.scanned)
		}
		if st2, _ := os.Stat(ref); !st2.ModTime().Equal(st.ModTime()) {
			t.Fatal("nothing new: the file was rewritten")
		}
		// Aborted: the file is left alone, and so is one without results.
		p := writeFile(t, dir, "abort.csv", data)
		w = NewIneffWriter(p)
		w.Add(offs[marks[0].ID], marks[0])
		w.Final(int64(len(data)))
		w.Abort()
		if n, err := NewIneffWriter(p).Commit(); n != 0 || err != nil {
			t.Fatalf("no results: %d, %v", n, err)
		}
		if got, _ := os.ReadFile(p); !bytes.Equal(got, data) {
			t.Fatal("aborted: the file changed")
		}
		if tmp, _ := filepath.Glob(filepath.Join(dir, ".*.tmp")); len(tmp) != 0 {
			t.Fatalf("temporary files left: %v", tmp)
		}
	}
}
