package spool

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	"msmemscope/trace"
)

// Rotated logs (--log-mode=rotate, SPEC §7; written by capture.Rotator):
// spool/log_NNNNNN.zst, each a run of independent zstd frames holding a
// self-contained spool (header, the records every reader needs, the blocks
// live when it began flagged FInherit in INHR chunks, AHED chunks of late
// records a later log holds), then late.bin for what came after the final
// drain.

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
	// By number: past log_999999 the names grow a digit.
	sort.Slice(m, func(i, j int) bool {
		if a, b := logSeq(m[i]), logSeq(m[j]); a != b {
			return a < b
		}
		return m[i] < m[j]
	})
	return m
}

// logSeq is a log's number (log_NNNNNN.zst), -1 if its name has none.
func logSeq(p string) int {
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), LogPrefix), LogSuffix))
	if err != nil {
		return -1
	}
	return n
}

// decoder is shared: DecodeAll is safe for concurrent use.
var logDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0))

// ReadLog decompresses one rotated log. A frame cut off by a kill ends it:
// the frames before it are kept (the spool reader keeps whole events only).
func ReadLog(path string) ([]byte, error) { return readLog(path, false) }

// readLog decompresses one rotated log; whole: a frame cut short or damaged
// is an error, not the log's end.
func readLog(path string, whole bool) ([]byte, error) {
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
	if whole {
		return nil, fmt.Errorf("%s: %v%s", path, err, trace.CutShort)
	}
	// Damaged or truncated: decode frame by frame, as far as they go.
	out, serr := salvageFrames(z)
	if serr == nil && len(out) < HdrSize {
		serr = err
	}
	if serr != nil {
		return nil, fmt.Errorf("%s: %v", path, serr)
	}
	return out, nil
}

// OpenCapture opens a capture folder's spool: spool.bin, or, for a rotating
// capture, its logs and late.bin read in place as one spool (logSpool).
func OpenCapture(dir string) (*Spool, error) { return OpenCaptureEnded(dir, ReadEnd(dir)) }

// OpenCaptureEnded is OpenCapture given the capture's end.json as read
// before (nil: none), so that a process ending meanwhile is not judged by
// an end newer than the files opened. A capture whose spool writes failed
// (end.DrainErrors) may end inside a chunk or a frame, as a killed run's.
func OpenCaptureEnded(dir string, end *EndMeta) (*Spool, error) {
	logs := LogFiles(dir)
	if len(logs) == 0 {
		if end != nil && end.LastLog > 0 {
			return nil, fmt.Errorf("%s: the rotated logs are missing (end.json names log %d as the newest)", filepath.Join(dir, SpoolDir), end.LastLog)
		}
		// A process that ended normally, its writes all done, flushed
		// whole chunks: a file cut short was damaged, not killed.
		path := filepath.Join(dir, SpoolDir, FileName)
		s, err := OpenFile(path)
		if err == nil && end.SpoolWhole() {
			if err = s.Damaged(path, end); err != nil {
				s.Close()
			}
		}
		return s, err
	}
	if err := logsWhole(dir, logs, end); err != nil {
		return nil, err
	}
	ls, err := openLogSpool(dir)
	if err != nil {
		return nil, err
	}
	if len(ls.damaged) > 0 && end.SpoolWhole() {
		// The process ended normally: its logs were closed whole.
		ls.Close()
		return nil, fmt.Errorf("%s%s", ls.damaged[0], trace.CutShort)
	}
	s, err := NewLogs(ls, ls.size, ls.laterLogs)
	if err != nil {
		ls.Close()
		return nil, fmt.Errorf("%s: %v", filepath.Join(dir, SpoolDir), err)
	}
	// A log cut short reads as such, though its last chunk was made to end
	// on its whole units (endOnChunk).
	s.Truncated = s.Truncated || len(ls.damaged) > 0
	s.CutLogs = ls.damaged
	s.closer = ls
	return s, nil
}

// logsWhole reports a log missing from a capture's: the rotation deletes
// the oldest only, so the logs kept are numbered without a gap, up to the
// newest that end.json names when the process ended normally.
func logsWhole(dir string, logs []string, end *EndMeta) error {
	for i := 1; i < len(logs); i++ {
		if a, b := logSeq(logs[i-1]), logSeq(logs[i]); a >= 0 && b > a+1 {
			return fmt.Errorf("%s: %s%06d%s is missing (logs %s to %s are there, and the rotation deletes the oldest only)",
				filepath.Join(dir, SpoolDir), LogPrefix, a+1, LogSuffix, filepath.Base(logs[0]), filepath.Base(logs[len(logs)-1]))
		}
	}
	if end != nil && end.LastLog > 0 {
		if last := logSeq(logs[len(logs)-1]); last >= 0 && last < end.LastLog {
			return fmt.Errorf("%s: %s%06d%s, the newest log, is missing (end.json names it)", filepath.Join(dir, SpoolDir), LogPrefix, end.LastLog, LogSuffix)
		}
	}
	return nil
}

// OpenLog opens one rotated log alone (each is self-contained).
func OpenLog(path string) (*Spool, error) {
	b, err := ReadLog(path)
	if err != nil {
		return nil, err
	}
	return openLogBytes(path, b)
}

// OpenWholeLog is OpenLog for a log that must be whole (the process that
// wrote it ended, or it is read outside its capture folder): a frame cut
// short or damaged is an error, not the end of the log.
func OpenWholeLog(path string) (*Spool, error) {
	b, err := readLog(path, true)
	if err != nil {
		return nil, err
	}
	return openLogBytes(path, b)
}

func openLogBytes(path string, b []byte) (*Spool, error) {
	sp, err := New(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return sp, nil
}
