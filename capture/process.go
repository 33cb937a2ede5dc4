// Package capture manages one traced process image's folder (SPEC §2) while
// it runs: it creates the folder and spool when collection begins, records
// what the process was, and rotates the logs (rotate.go). Package collect
// turns the spool into the files users read; package spool reads it back.
package capture

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"msmemscope/config"
	"msmemscope/internal/safefs"
	"msmemscope/internal/version"
	"msmemscope/spool"
)

// The folder's layout and the reading of process.json and end.json are
// spool's (spool/layout.go).

// Process is a capture being recorded by this process.
type Process struct {
	Dir        string
	meta       spool.ProcessMeta
	spool      *os.File // kept open to the very end: the C side writes to its fd
	drainErrs  atomic.Uint64
	rotLate    uint64
	rotDeleted uint64
	rotLast    int
	// firstOutput is the output folder the capture began in: the CLI looks
	// for it there (Move leaves a note).
	firstOutput string
}

// MonoNs reads CLOCK_MONOTONIC, the clock of every event.
func MonoNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Stamp formats local time as SPEC §2's {timestamp}.
func Stamp(t time.Time) string { return safefs.Stamp(t) }

// NewDir creates a new folder prefix+{timestamp}+suffix under parent, adding
// milliseconds (and then a counter) only where needed to be unique.
func NewDir(parent, prefix, suffix string) (string, error) {
	names := safefs.Stamped(filepath.Join(parent, prefix), suffix, time.Now())
	return safefs.CreateUnique(names, safefs.MakeDir)
}

// Begin creates the process folder, its spool and process.json.
func Begin(cfg config.Config, pid int, runID string) (*Process, error) {
	if err := safefs.EnsureDir(cfg.Output); err != nil {
		return nil, err
	}
	rank := os.Getenv("RANK")
	suffix := ""
	if rank != "" {
		suffix = "_rank" + rank
	}
	dir, err := NewDir(cfg.Output, fmt.Sprintf("msmemscope_%d_", pid), suffix)
	if err != nil {
		return nil, err
	}
	if err := safefs.MakeDir(filepath.Join(dir, spool.SpoolDir)); err != nil {
		return nil, err
	}
	f, err := safefs.CreateNew(filepath.Join(dir, spool.SpoolDir, spool.FileName), os.O_APPEND|unix.O_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := spool.WriteHeader(f, pid); err != nil {
		f.Close()
		return nil, err
	}
	p := &Process{Dir: dir, spool: f, firstOutput: cfg.Output}
	p.meta = spool.ProcessMeta{
		Pid: pid, Ppid: os.Getppid(), Cmdline: cmdline(), RunID: runID, Rank: rank,
		StartUnixNs: time.Now().UnixNano(), StartMonoNs: MonoNs(),
		Version: version.Version, Config: cfg,
	}
	p.meta.Exe, _ = os.Readlink("/proc/self/exe")
	if err := safefs.WriteJSON(filepath.Join(dir, spool.SpoolDir, spool.ProcessFile), p.meta); err != nil {
		return nil, err
	}
	copyMaps(filepath.Join(dir, spool.SpoolDir, spool.MapsStart))
	return p, nil
}

func cmdline() []string {
	b, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		return os.Args
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

func copyMaps(dst string) {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return
	}
	_ = safefs.WriteNew(dst, func(w io.Writer) error { _, err := w.Write(b); return err })
}

// SpoolFD is the descriptor the C hot path writes the spool through.
func (p *Process) SpoolFD() int { return int(p.spool.Fd()) }

// Standalone reports whether no CLI run owns this capture, so the process
// writes its own files at exit.
func (p *Process) Standalone() bool { return p.meta.RunID == "" }

// NoteDrainErrors counts failed spool writes (a full disk, say).
func (p *Process) NoteDrainErrors(n uint64) { p.drainErrs.Add(n) }

// NoteRotator records what end.json says of the rotating logs, once they
// are closed: late records, the events the deleted logs held, the newest.
func (p *Process) NoteRotator(r *Rotator) {
	p.rotLate, p.rotDeleted, p.rotLast = r.Late, r.Deleted, r.LastLog()
}

// Move moves the capture folder, whole, into the output folder output (a
// program's config(output=...) after the capture began). The spool's
// descriptor and every file already open stay valid: the folder is renamed,
// not copied, so both must be on one file system. Under a CLI run a note in
// the old output folder tells the CLI where the folder went
// (spool.MovedNote). Returns the old folder.
func (p *Process) Move(output string) (string, error) {
	if err := safefs.EnsureDir(output); err != nil {
		return "", err
	}
	old := p.Dir
	suffix := ""
	if p.meta.Rank != "" {
		suffix = "_rank" + p.meta.Rank
	}
	dir, err := NewDir(output, fmt.Sprintf("msmemscope_%d_", p.meta.Pid), suffix)
	if err != nil {
		return "", err
	}
	// rename(2) replaces the empty folder NewDir reserved (os.Rename
	// refuses an existing folder).
	if err := unix.Rename(old, dir); err != nil {
		os.Remove(dir)
		return "", err
	}
	p.Dir = dir
	p.meta.Config.Output = output
	_ = safefs.ReplaceJSON(filepath.Join(dir, spool.SpoolDir, spool.ProcessFile), p.meta)
	if p.meta.RunID != "" {
		// In the CLI's own output folder, whatever moved the capture before.
		note := spool.MovedNote(p.firstOutput, p.meta.RunID, p.meta.Pid)
		_ = safefs.Replace(note, func(w io.Writer) error { _, err := io.WriteString(w, dir); return err })
	}
	return old, nil
}

// End records how the image ended. The spool stays open: events after this
// (frees in later destructors) are still written to it.
func (p *Process) End(lost, forks uint64) {
	copyMaps(filepath.Join(p.Dir, spool.SpoolDir, spool.MapsEnd))
	var size int64
	if fi, err := p.spool.Stat(); err == nil {
		size = fi.Size()
	}
	_ = safefs.WriteJSON(filepath.Join(p.Dir, spool.SpoolDir, spool.EndFile), spool.EndMeta{
		EndMonoNs: MonoNs(), Lost: lost, Forks: forks, DrainErrors: p.drainErrs.Load(), RotateLate: p.rotLate, RotateDeleted: p.rotDeleted,
		SpoolBytes: size, LastLog: p.rotLast,
	})
}
