// Package logx is msmemscope's own messages, filtered by --log-level: info
// adds progress lines (the options in effect, each conversion's figures);
// warn, the default, prints warnings; error leaves only errors. The results
// (leak summaries, where the files are) are the answer, not log messages:
// they print at every level.
package logx

import (
	"fmt"
	"io"
	"os"
	"sync/atomic"
)

const (
	levelInfo int32 = iota
	levelWarn
	levelError
)

var level atomic.Int32

func init() { level.Store(levelWarn) }

// SetLevel applies a --log-level value (info, warn or error; anything else
// is warn, the default: values are checked where options are parsed).
func SetLevel(s string) {
	switch s {
	case "info":
		level.Store(levelInfo)
	case "error":
		level.Store(levelError)
	default:
		level.Store(levelWarn)
	}
}

// Warnf prints "msmemscope: warning: ..." to stderr unless the level is error.
func Warnf(format string, args ...any) { WarnTo(os.Stderr, format, args...) }

// WarnTo is Warnf to w (nil: nowhere).
func WarnTo(w io.Writer, format string, args ...any) {
	if w != nil && level.Load() <= levelWarn {
		fmt.Fprintf(w, "msmemscope: warning: "+format+"\n", args...)
	}
}

// Infof prints "msmemscope: ..." to stderr at level info only.
func Infof(format string, args ...any) { InfoTo(os.Stderr, format, args...) }

// InfoTo is Infof to w (nil: nowhere).
func InfoTo(w io.Writer, format string, args ...any) {
	if w != nil && level.Load() <= levelInfo {
		fmt.Fprintf(w, "msmemscope: "+format+"\n", args...)
	}
}
