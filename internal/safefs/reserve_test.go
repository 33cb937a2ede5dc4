package safefs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A write that would leave less than the reserve free stops, and the
// half-written file is not left behind under either name.
func TestWriteNewKeepsTheReserve(t *testing.T) {
	dir := t.TempDir()
	_, free, err := Reserve(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Room for 20 MiB more: a 64 MiB file stops after a look at 16 or 32 MiB.
	t.Setenv("MSMEMSCOPE_DISK_RESERVE", strconv.FormatUint(free-20<<20, 10))
	p := filepath.Join(dir, "big.csv")
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	var wrote int
	err = WriteDerived(p, func(w io.Writer) error {
		for i := 0; i < 64; i++ {
			n, err := w.Write(chunk)
			wrote += n
			if err != nil {
				return err
			}
		}
		return nil
	})
	var full *ErrReserve
	if !errors.As(err, &full) {
		t.Fatalf("WriteNew: %v, want an ErrReserve", err)
	}
	if wrote >= 64<<20 || wrote > 20<<20 {
		t.Errorf("wrote %d MiB before stopping, want at most 20", wrote>>20)
	}
	for _, q := range []string{p, p + ".partial"} {
		if _, err := os.Stat(q); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", q, err)
		}
	}
	t.Log(err)
	// Room again: it writes.
	t.Setenv("MSMEMSCOPE_DISK_RESERVE", "0")
	if err := WriteDerived(p, func(w io.Writer) error { _, err := w.Write(chunk); return err }); err != nil {
		t.Fatal(err)
	}
}

// MSMEMSCOPE_DISK_RESERVE: a byte count is the reserve, and the stop line
// names it; anything else leaves the default (it was ignored without a
// word, and the line named the default's rule all the same).
func TestReserveFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(reserveEnv, "")
	def, _, err := Reserve(dir)
	if err != nil {
		t.Skip(err)
	}
	t.Setenv(reserveEnv, "12345")
	if n, _, _ := Reserve(dir); n != 12345 {
		t.Errorf("reserve %d, want 12345", n)
	}
	if msg := (&ErrReserve{Path: "x", Reserve: 12345}).Error(); !strings.Contains(msg, "(MSMEMSCOPE_DISK_RESERVE=12345)") {
		t.Errorf("the stop line does not name the figure set: %s", msg)
	}
	for _, bad := range []string{"abc", "-1", "1.5", "1G"} {
		t.Setenv(reserveEnv, bad)
		if n, _, _ := Reserve(dir); n != def {
			t.Errorf("%s=%q: reserve %d, want the default %d", reserveEnv, bad, n, def)
		}
	}
}
