package safefs

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
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
