package safefs

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// Output names are never reused (an existing file is never overwritten): a
// writer tries a sequence of names until one is free.

// maxNames bounds the names tried before giving up.
const maxNames = 1000

// Stamp formats local time as SPEC §2's {timestamp}.
func Stamp(t time.Time) string { return t.Format("20060102150405") }

// Numbered names base+ext, then base_1+ext, base_2+ext, ...
func Numbered(base, ext string) func(i int) string {
	return func(i int) string {
		if i == 0 {
			return base + ext
		}
		return fmt.Sprintf("%s_%d%s", base, i, ext)
	}
}

// Stamped names prefix{timestamp}suffix, then with the milliseconds added,
// then with a counter too: prefix{timestamp}{ms}_N suffix.
func Stamped(prefix, suffix string, now time.Time) func(i int) string {
	stamp, ms := Stamp(now), now.Nanosecond()/1e6
	return func(i int) string {
		switch i {
		case 0:
			return prefix + stamp + suffix
		case 1:
			return fmt.Sprintf("%s%s%03d%s", prefix, stamp, ms, suffix)
		}
		return fmt.Sprintf("%s%s%03d_%d%s", prefix, stamp, ms, i-1, suffix)
	}
}

// CreateUnique calls create with names(0), names(1), ... until it succeeds,
// and returns the name it took. create must fail with an error wrapping
// os.ErrExist when a name is taken (CreateNew, WriteNew, MakeDir do); any
// other error ends the search.
func CreateUnique(names func(i int) string, create func(p string) error) (string, error) {
	for i := 0; i < maxNames; i++ {
		p := names(i)
		err := create(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("cannot find a free name like %s", names(0))
}

// FreeName returns the first of names(0), names(1), ... that does not exist
// yet, for writers that create the file themselves.
func FreeName(names func(i int) string) string {
	for i := 0; ; i++ {
		p := names(i)
		if !exists(p) && !exists(p+".partial") || i >= maxNames {
			return p // (a .partial is a file being written, or left by a writer killed: WriteNew's)
		}
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return !os.IsNotExist(err)
}
