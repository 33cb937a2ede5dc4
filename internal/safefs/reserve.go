package safefs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"msmemscope/internal/logx"
)

// The disk is never filled (SPEC §8): while it writes a derived file (a
// dump, a report) msmemscope keeps this much free on its file system, 1 GiB
// or 5% of the file system, whichever is less. MSMEMSCOPE_DISK_RESERVE
// (bytes) sets another figure.
const reserveMax = 1 << 30

// reserveCheckEvery is how many bytes a writer writes between two looks at
// the free space.
const reserveCheckEvery = 16 << 20

// Reserve returns the space to keep free on dir's file system and what is
// free there now.
func Reserve(dir string) (reserve, free uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	free = st.Bavail * uint64(st.Bsize)
	reserve = min(reserveMax, st.Blocks*uint64(st.Bsize)/20)
	if n, ok := reserveSet(); ok {
		reserve = n
	}
	return reserve, free, nil
}

// reserveSet is MSMEMSCOPE_DISK_RESERVE's figure, if it gives one. A value
// that is not a byte count is said once and left aside.
func reserveSet() (uint64, bool) {
	v := os.Getenv(reserveEnv)
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		reserveWarn.Do(func() {
			logx.Warnf("%s=%q is not a number of bytes (an integer in [0,2^64)): the disk reserve stays 1 GiB, or 5%% of the file system if less", reserveEnv, v)
		})
		return 0, false
	}
	return n, true
}

const reserveEnv = "MSMEMSCOPE_DISK_RESERVE"

var reserveWarn sync.Once

// ErrReserve says that writing more would leave less than the reserve free.
type ErrReserve struct {
	Path                string
	Free, Reserve, Need uint64 // Need: the bytes about to be written
}

func (e *ErrReserve) Error() string {
	what := fmt.Sprintf("writing %s more would leave less than", HumanBytes(e.Need))
	if e.Need == 0 {
		what = "that is less than" // (looked at before writing)
	}
	why := "1 GiB, or 5% of the file system if less; " + reserveEnv + " sets another"
	if n, ok := reserveSet(); ok {
		why = fmt.Sprintf("%s=%d", reserveEnv, n)
	}
	return fmt.Sprintf("stopped writing %s: its file system has %s free, and %s the %s msmemscope keeps free (%s)",
		e.Path, HumanBytes(e.Free), what, HumanBytes(e.Reserve), why)
}

// CheckReserve returns an *ErrReserve when writing n more bytes to path
// would leave less than the reserve free.
func CheckReserve(path string, n uint64) error {
	reserve, free, err := Reserve(filepath.Dir(path))
	if err != nil {
		return nil // nothing to measure by: the write itself will tell
	}
	if free < reserve+n {
		return &ErrReserve{Path: path, Free: free, Reserve: reserve, Need: n}
	}
	return nil
}

// reserveWriter stops writing path when the reserve would be crossed.
type reserveWriter struct {
	w       io.Writer
	path    string
	written uint64
	next    uint64 // when to look again
}

func (r *reserveWriter) Write(p []byte) (int, error) {
	if r.written+uint64(len(p)) >= r.next {
		// Room for what comes before the next look, too.
		if err := CheckReserve(r.path, uint64(len(p))+reserveCheckEvery); err != nil {
			return 0, err
		}
		r.next = r.written + reserveCheckEvery
	}
	n, err := r.w.Write(p)
	r.written += uint64(n)
	return n, err
}

// HumanBytes formats a byte count: "512 B", "4.0 KiB", "1.5 MiB".
func HumanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(n, 10) + " B"
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
