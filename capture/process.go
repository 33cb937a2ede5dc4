// Package capture manages one traced process image's folder (SPEC §2): it
// creates the folder and spool when collection begins, records what the
// process was, and turns the spool into the files users read (Convert).
package capture

import (
	"encoding/json"
	"errors"
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
	"msmemscope/trace"
)

// File names inside a process folder.
const (
	ProcessFile = "process.json"
	EndFile     = "end.json"
	MapsStart   = "maps.start.txt"
	MapsEnd     = "maps.end.txt"
	SpoolDir    = "spool"
	DumpDir     = "dump"
	AnalysisDir = "analysis"
	ConfigFile  = "config.json"
)

// ProcessMeta is written to spool/process.json when collection begins.
type ProcessMeta struct {
	Pid         int           `json:"pid"`
	Ppid        int           `json:"ppid"`
	Cmdline     []string      `json:"cmdline"`
	Exe         string        `json:"exe"`
	RunID       string        `json:"run_id,omitempty"`
	Rank        string        `json:"rank,omitempty"`
	StartUnixNs int64         `json:"start_unix_ns"`
	StartMonoNs int64         `json:"start_mono_ns"`
	Version     string        `json:"version"`
	Config      config.Config `json:"config"`
}

// EndMeta is written to spool/end.json when the image ends normally.
type EndMeta struct {
	EndMonoNs   int64  `json:"end_mono_ns"`
	Lost        uint64 `json:"events_lost"`
	Forks       uint64 `json:"forks"`
	DrainErrors uint64 `json:"drain_errors"`
}

// Process is a capture being recorded by this process.
type Process struct {
	Dir       string
	meta      ProcessMeta
	spool     *os.File // kept open to the very end: the C side writes to its fd
	drainErrs atomic.Uint64
}

// MonoNs reads CLOCK_MONOTONIC, the clock of every event.
func MonoNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Stamp formats local time as SPEC §2's {timestamp}.
func Stamp(t time.Time) string { return t.Format("20060102150405") }

// NewDir creates a new folder prefix+{timestamp}+suffix under parent, adding
// milliseconds (and then a counter) only where needed to be unique.
func NewDir(parent, prefix, suffix string) (string, error) {
	now := time.Now()
	base := prefix + Stamp(now)
	names := []string{base + suffix, fmt.Sprintf("%s%03d%s", base, now.Nanosecond()/1e6, suffix)}
	for i := 1; i < 1000; i++ {
		names = append(names, fmt.Sprintf("%s%03d_%d%s", base, now.Nanosecond()/1e6, i, suffix))
	}
	for _, n := range names {
		d := filepath.Join(parent, n)
		err := safefs.MakeDir(d)
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("cannot find a free folder name under %s", parent)
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
	if err := safefs.MakeDir(filepath.Join(dir, SpoolDir)); err != nil {
		return nil, err
	}
	f, err := safefs.CreateNew(filepath.Join(dir, SpoolDir, trace.SpoolFileName), os.O_APPEND|unix.O_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := trace.WriteSpoolHeader(f, pid); err != nil {
		f.Close()
		return nil, err
	}
	p := &Process{Dir: dir, spool: f}
	p.meta = ProcessMeta{
		Pid: pid, Ppid: os.Getppid(), Cmdline: cmdline(), RunID: runID, Rank: rank,
		StartUnixNs: time.Now().UnixNano(), StartMonoNs: MonoNs(),
		Version: version.Version, Config: cfg,
	}
	p.meta.Exe, _ = os.Readlink("/proc/self/exe")
	if err := writeJSON(filepath.Join(dir, SpoolDir, ProcessFile), p.meta); err != nil {
		return nil, err
	}
	copyMaps(filepath.Join(dir, SpoolDir, MapsStart))
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

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return safefs.WriteNew(path, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// SpoolFD is the descriptor the C hot path writes the spool through.
func (p *Process) SpoolFD() int { return int(p.spool.Fd()) }

// Standalone reports whether no CLI run owns this capture, so the process
// writes its own files at exit.
func (p *Process) Standalone() bool { return p.meta.RunID == "" }

// NoteDrainErrors counts failed spool writes (a full disk, say).
func (p *Process) NoteDrainErrors(n uint64) { p.drainErrs.Add(n) }

// End records how the image ended. The spool stays open: events after this
// (frees in later destructors) are still written to it.
func (p *Process) End(lost, forks uint64) {
	copyMaps(filepath.Join(p.Dir, SpoolDir, MapsEnd))
	_ = writeJSON(filepath.Join(p.Dir, SpoolDir, EndFile), EndMeta{
		EndMonoNs: MonoNs(), Lost: lost, Forks: forks, DrainErrors: p.drainErrs.Load(),
	})
}

// ReadMeta reads a process folder's process.json.
func ReadMeta(dir string) (*ProcessMeta, error) {
	var m ProcessMeta
	b, err := os.ReadFile(filepath.Join(dir, SpoolDir, ProcessFile))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", filepath.Join(dir, SpoolDir, ProcessFile), err)
	}
	return &m, nil
}

// readEnd reads end.json; nil when the image did not end normally (killed).
func readEnd(dir string) *EndMeta {
	var m EndMeta
	b, err := os.ReadFile(filepath.Join(dir, SpoolDir, EndFile))
	if err != nil || json.Unmarshal(b, &m) != nil {
		return nil
	}
	return &m
}
