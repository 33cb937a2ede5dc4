// Package safefs applies the safety rules of SPEC §8 to everything msmemscope
// writes: folders 0750, files 0640, no symlinked or world-writable output
// folder, paths of bounded length and plain characters, and never an
// overwritten or half-written file presented as whole.
package safefs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

const (
	DirMode  = 0o750
	FileMode = 0o640
	MaxPath  = 4096
)

// CheckPath rejects paths that are too long or hold control characters.
func CheckPath(p string) error {
	if p == "" {
		return fmt.Errorf("empty path")
	}
	if len(p) > MaxPath {
		return fmt.Errorf("path %.40q… is %d bytes long: at most %d are allowed", p, len(p), MaxPath)
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("path %q holds a control character", p)
		}
	}
	return nil
}

// checkDir refuses a folder that is a symlink or that others can write to.
func checkDir(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("output folder %s is a symbolic link: refused", p)
	}
	if !fi.IsDir() {
		return fmt.Errorf("output path %s exists and is not a folder", p)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("output folder %s is writable by others (mode %04o): refused", p, fi.Mode().Perm())
	}
	return nil
}

// EnsureDir creates p (and missing parents) with mode 0750 and checks it.
func EnsureDir(p string) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("output folder %s is a symbolic link: refused", p)
	}
	if err := os.MkdirAll(p, DirMode); err != nil {
		return fmt.Errorf("cannot create folder %s: %v", p, err)
	}
	return checkDir(p)
}

// MakeDir creates a new folder p (its parent must exist) with mode 0750.
func MakeDir(p string) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	if err := os.Mkdir(p, DirMode); err != nil {
		return err
	}
	_ = os.Chmod(p, DirMode) // umask may have narrowed it; never widen beyond 0750
	return checkDir(p)
}

// CreateNew creates a file that must not exist yet, mode 0640.
func CreateNew(p string, extra int) (*os.File, error) {
	if err := CheckPath(p); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|extra, FileMode)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// WriteNew writes a new file through a temporary name and links it into
// place only once complete: a reader never sees a half-written file, and an
// existing file is never overwritten.
func WriteNew(p string, write func(w io.Writer) error) error { return writeNew(p, write, false) }

// WriteDerived is WriteNew for a file derived from a capture (a dump, a
// report): it keeps the disk's reserve (Reserve), stopping with an
// *ErrReserve before crossing it; the capture's own files never stop.
func WriteDerived(p string, write func(w io.Writer) error) error { return writeNew(p, write, true) }

func writeNew(p string, write func(w io.Writer) error, reserve bool) error {
	tmp := p + ".partial"
	if reserve {
		if err := CheckReserve(p, 0); err != nil {
			return err
		}
	}
	f, err := CreateNew(tmp, 0)
	if err != nil {
		return err
	}
	if reserve {
		err = write(&reserveWriter{w: f, path: p})
	} else {
		err = write(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, p)
	}
	os.Remove(tmp)
	var full *ErrReserve
	if errors.As(err, &full) {
		return err
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", p, err)
	}
	return nil
}

// Replace atomically replaces an existing file p with new contents (the one
// case where msmemscope rewrites a file: offline results added in place).
func Replace(p string, write func(w io.Writer) error) error {
	return ReplaceFile(p, func(f *os.File) error { return write(f) })
}

// ReplaceFile is Replace for writers that need the temporary file itself
// (to copy into it in the kernel, truncate it, or start its writeback).
func ReplaceFile(p string, write func(f *os.File) error) error {
	dir, base := filepath.Split(p)
	f, err := os.CreateTemp(dir, "."+strings.TrimPrefix(base, ".")+".*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if fi, serr := os.Stat(p); serr == nil {
			_ = os.Chmod(tmp, fi.Mode().Perm())
		}
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("cannot rewrite %s: %w", p, err)
	}
	return nil
}

// WriteJSON writes v, indented, into the new file p.
func WriteJSON(p string, v any) error { return writeJSON(p, v, WriteNew) }

// ReplaceJSON is WriteJSON over an existing file (Replace).
func ReplaceJSON(p string, v any) error { return writeJSON(p, v, Replace) }

func writeJSON(p string, v any, write func(string, func(io.Writer) error) error) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return write(p, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}
