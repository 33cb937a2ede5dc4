package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestNames(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 678e6, time.Local)
	st := Stamped("/o/run_", ".json", now)
	for i, want := range []string{"/o/run_20260102030405.json", "/o/run_20260102030405678.json", "/o/run_20260102030405678_1.json", "/o/run_20260102030405678_2.json"} {
		if got := st(i); got != want {
			t.Errorf("Stamped(%d) = %s, want %s", i, got, want)
		}
	}
	nb := Numbered("/o/dump", ".csv")
	for i, want := range []string{"/o/dump.csv", "/o/dump_1.csv", "/o/dump_2.csv"} {
		if got := nb(i); got != want {
			t.Errorf("Numbered(%d) = %s, want %s", i, got, want)
		}
	}
}

func TestCreateUnique(t *testing.T) {
	dir := t.TempDir()
	names := Numbered(filepath.Join(dir, "f"), ".txt")
	create := func(p string) error {
		f, err := CreateNew(p, 0)
		if err == nil {
			f.Close()
		}
		return err
	}
	for i := 0; i < 3; i++ {
		p, err := CreateUnique(names, create)
		if err != nil || p != names(i) {
			t.Fatalf("CreateUnique %d: %s %v", i, p, err)
		}
	}
	if p := FreeName(names); p != names(3) {
		t.Errorf("FreeName = %s, want %s", p, names(3))
	}
	// A name whose .partial exists (a file being written, or left by a
	// writer that was killed) is taken too: WriteNew could not create it.
	if err := create(names(3) + ".partial"); err != nil {
		t.Fatal(err)
	}
	if p := FreeName(names); p != names(4) {
		t.Errorf("FreeName beside a .partial = %s, want %s", p, names(4))
	}
	// Another error ends the search.
	boom := errors.New("boom")
	if _, err := CreateUnique(names, func(string) error { return boom }); err != boom {
		t.Errorf("error: %v", err)
	}
	// MakeDir reports a taken name as os.ErrExist too.
	d, err := CreateUnique(Numbered(filepath.Join(dir, "f"), ".txt"), MakeDir)
	if err != nil || d != names(3) {
		t.Errorf("MakeDir: %s %v", d, err)
	}
	if _, err := os.Stat(d); err != nil {
		t.Error(err)
	}
}
