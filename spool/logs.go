package spool

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"

	"msmemscope/internal/safefs"
)

// Rotated logs (--log-mode=rotate, SPEC §7; written by capture.Rotator):
// spool/log_NNNNNN.zst, each a run of independent zstd frames holding a
// self-contained spool (header, the records every reader needs, the blocks
// live when it began flagged FInherit), then late.bin for what came after
// the final drain.

// LogPrefix and LogSuffix name the rotated logs inside the spool folder.
const (
	LogPrefix = "log_"
	LogSuffix = ".zst"
	// In rotate mode spool.bin receives only what bypasses the logs: events
	// after the final drain (destructors) and at exec.
	LateFile = FileName
)

// LogFiles lists a capture's rotated logs, oldest first.
func LogFiles(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, SpoolDir, LogPrefix+"*"+LogSuffix))
	sort.Strings(m)
	return m
}

// decoder is shared: DecodeAll is safe for concurrent use.
var logDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0))

// ReadLog decompresses one rotated log. A frame cut off by a kill ends it:
// the frames before it are kept (the spool reader keeps whole events only).
func ReadLog(path string) ([]byte, error) {
	z, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	// Our frames carry their size: decoding them all at once into one buffer
	// avoids regrowing it (the parallel timeline decodes a log per goroutine).
	out, err := logDecoder.DecodeAll(z, make([]byte, 0, 10*len(z)))
	if err == nil {
		return out, nil
	}
	// Damaged or truncated: decode frame by frame, as far as they go.
	d, derr := zstd.NewReader(bytes.NewReader(z), zstd.WithDecoderConcurrency(1))
	if derr != nil {
		return nil, fmt.Errorf("%s: %v", path, derr)
	}
	defer d.Close()
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, d); err != nil && buf.Len() < HdrSize {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return buf.Bytes(), nil
}

// OpenCapture opens a capture folder's spool: spool.bin, or, for a rotating
// capture, its logs and late.bin combined into one temporary raw spool. The
// logs are not read in place: the spool is read by random access, thread by
// thread, and holding every log decompressed in memory instead would make
// memory grow with the disk that rotation bounds.
func OpenCapture(dir string) (*Spool, error) {
	if len(LogFiles(dir)) == 0 {
		return OpenFile(filepath.Join(dir, SpoolDir, FileName))
	}
	tmp := filepath.Join(dir, SpoolDir, fmt.Sprintf(".combined-%d-%d.bin", os.Getpid(), time.Now().UnixNano()))
	defer os.Remove(tmp) // the open spool keeps it readable
	if err := combineLogs(dir, tmp); err != nil {
		return nil, err
	}
	return OpenFile(tmp)
}

// OpenLog opens one rotated log alone (each is self-contained).
func OpenLog(path string) (*Spool, error) {
	b, err := ReadLog(path)
	if err != nil {
		return nil, err
	}
	sp, err := New(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return sp, nil
}

// combineLogs writes the rotated logs still on disk and late.bin into one raw
// spool (dst), oldest first: what Convert reads for a rotating capture.
func combineLogs(dir, dst string) error {
	files := LogFiles(dir)
	if len(files) == 0 {
		return fmt.Errorf("%s: no rotated logs", dir)
	}
	out, err := safefs.CreateNew(dst, 0)
	if err != nil {
		return err
	}
	defer out.Close()
	for i, f := range files {
		b, err := ReadLog(f)
		if err != nil {
			return err
		}
		if len(b) < HdrSize || string(b[:8]) != Magic {
			return fmt.Errorf("%s: not an msmemscope log", f)
		}
		if i > 0 {
			b = b[HdrSize:]
		}
		if _, err := out.Write(b); err != nil {
			return err
		}
	}
	late, err := os.ReadFile(filepath.Join(dir, SpoolDir, LateFile))
	if err == nil && len(late) > HdrSize && strings.HasPrefix(string(late), Magic) {
		if _, err := out.Write(late[HdrSize:]); err != nil {
			return err
		}
	}
	return out.Close()
}
