package spool

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"msmemscope/config"

	"msmemscope/trace"
)

// The capture folder (SPEC §2): one traced process image's files.
//
//	msmemscope_{pid}_{timestamp}/
//	  spool/      process.json, end.json, maps.*.txt, spool.bin, log_NNNNNN.zst
//	  dump/       memscope_dump_{timestamp}.csv or .db
//	  analysis/   the analyses' reports
//	  config.json
//
// An output folder holds capture folders and, for each CLI run, a manifest
// run_{timestamp}.json naming them.
const (
	ProcessFile = "process.json"
	EndFile     = "end.json"
	CrashFile   = "crash.json"
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

// ProgName is the program's short name, for messages.
func (m *ProcessMeta) ProgName() string {
	if len(m.Cmdline) > 0 {
		return filepath.Base(m.Cmdline[0])
	}
	return filepath.Base(m.Exe)
}

// EndMeta is written to spool/end.json when the image ends normally.
type EndMeta struct {
	EndMonoNs   int64  `json:"end_mono_ns"`
	Lost        uint64 `json:"events_lost"`
	Forks       uint64 `json:"forks"`
	DrainErrors uint64 `json:"drain_errors"`
	// SpoolBytes is spool.bin's size when the process ended (later writes
	// only add to it): a file shorter than that was cut short.
	SpoolBytes int64 `json:"spool_bytes,omitempty"`
	// LastLog is the newest rotated log's number (log_NNNNNN.zst), 0
	// without rotation: the logs kept run up to it, without a gap.
	LastLog int `json:"last_log,omitempty"`
	// Rotating logs: MALLOCs and FREEs that reached the rotator after
	// their log's cut had settled (see README, rotating logs).
	RotateLate uint64 `json:"rotate_late,omitempty"`
	// Rotating logs: the events the logs deleted held.
	RotateDeleted uint64 `json:"rotate_deleted,omitempty"`
}

// SpoolWhole reports whether e (nil: no end.json) says the image ended
// normally with every write to its spool done: then a spool or log cut
// short was damaged, not ended early (a killed run's, or one whose writes
// failed, may end inside a chunk or a frame).
func (e *EndMeta) SpoolWhole() bool { return e != nil && e.DrainErrors == 0 }

// Damaged reports a single spool file (at path) that was to be whole but
// is cut short: inside a chunk, or, where its process's end.json gives
// the file's size at the end, between two.
func (s *Spool) Damaged(path string, end *EndMeta) error {
	if s.Truncated {
		return fmt.Errorf("%s: a chunk runs past the end of the file%s", path, trace.CutShort)
	}
	if end != nil && s.Bytes < end.SpoolBytes {
		return fmt.Errorf("%s: the spool is cut short (%d bytes; it had %d when the process ended, spool/%s says)", path, s.Bytes, end.SpoolBytes, EndFile)
	}
	return nil
}

// ReadMeta reads a capture folder's process.json.
func ReadMeta(dir string) (*ProcessMeta, error) {
	var m ProcessMeta
	b, err := os.ReadFile(filepath.Join(dir, SpoolDir, ProcessFile))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", filepath.Join(dir, SpoolDir, ProcessFile), err)
	}
	if m.Pid <= 0 {
		return nil, fmt.Errorf("%s: no process id (pid must be above 0)", filepath.Join(dir, SpoolDir, ProcessFile))
	}
	return &m, nil
}

// CrashMeta is written to spool/crash.json by the crash handler
// (libmemscope/crash.c) when the process dies of a crash signal (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL, SIGABRT) after its final drain.
type CrashMeta struct {
	Signal    int    `json:"signal"`
	SigCode   int    `json:"si_code"`
	Tid       int    `json:"tid"`
	EndMonoNs int64  `json:"end_mono_ns"`
	Lost      uint64 `json:"events_lost"`
	Drained   bool   `json:"drained"` // every thread's ring reached the spool
	// ExitStatus is _exit's status: Signal is 0 when the process ended by
	// _exit (no destructors, no exit scan) rather than a crash.
	ExitStatus *int `json:"exit_status,omitempty"`
}

// ReadCrash reads crash.json; nil when the process did not die of a crash
// signal after its final drain.
func ReadCrash(dir string) *CrashMeta { return readSpoolJSON[CrashMeta](dir, CrashFile) }

// readSpoolJSON reads a JSON file of a capture's spool folder; nil when it
// is missing or does not parse.
func readSpoolJSON[T any](dir, name string) *T {
	var m T
	b, err := os.ReadFile(filepath.Join(dir, SpoolDir, name))
	if err != nil || json.Unmarshal(b, &m) != nil {
		return nil
	}
	return &m
}

// How a process image ended, as config.json and the run manifest say.
const (
	EndedExit   = "exit"   // normally: exit or return from main (end.json)
	EndedCrash  = "crash"  // of a crash signal, after the final drain (crash.json)
	EndedQuick  = "_exit"  // by _exit or _Exit (Python's os._exit), after the final drain (crash.json, signal 0)
	EndedSignal = "signal" // by another signal's default action (SIGTERM, SIGPIPE, ...), after the final drain (crash.json)
	EndedExec   = "exec"   // it exec'd another program (whose image has a capture of its own)
	EndedKilled = "killed" // otherwise (SIGKILL, say): the spool ends at the drain's last pass
)

// Ended says how an image ended from its end.json and crash.json (either nil).
func Ended(end *EndMeta, crash *CrashMeta) string {
	switch {
	case end != nil:
		return EndedExit // a program's own crash handler may exit after ours drained
	case crash != nil && crash.Signal == 0:
		return EndedQuick
	case crash != nil && CrashSignal(syscall.Signal(crash.Signal)):
		return EndedCrash
	case crash != nil:
		return EndedSignal
	}
	return EndedKilled
}

// CrashSignal reports whether sig is one of the faults the library's crash
// handler drains on (libmemscope/crash.c's crash_sigs); its other handled
// signals end a program by their default action (end_sigs there).
func CrashSignal(sig syscall.Signal) bool {
	switch sig {
	case syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGILL, syscall.SIGABRT:
		return true
	}
	return false
}

// ReadEnd reads end.json; nil when the image did not end normally (killed).
func ReadEnd(dir string) *EndMeta { return readSpoolJSON[EndMeta](dir, EndFile) }

// IsCapture reports whether dir is a capture folder with its spool.
func IsCapture(dir string) bool {
	_, err := ReadMeta(dir)
	return err == nil
}

// Captures lists the capture folders (with a spool) directly inside dir.
func Captures(dir string) []string {
	var found []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		d := filepath.Join(dir, e.Name())
		if e.IsDir() && IsCapture(d) {
			found = append(found, d)
		}
	}
	return found
}

// DumpFiles lists the dump files of a capture folder, newest last.
func DumpFiles(dir string) []string {
	var out []string
	for _, pat := range []string{"memscope_dump_*.csv", "memscope_dump_*.db"} {
		m, _ := filepath.Glob(filepath.Join(dir, DumpDir, pat))
		out = append(out, m...)
	}
	sort.Slice(out, func(i, j int) bool {
		fi, _ := os.Stat(out[i])
		fj, _ := os.Stat(out[j])
		if fi != nil && fj != nil && !fi.ModTime().Equal(fj.ModTime()) {
			return fi.ModTime().Before(fj.ModTime())
		}
		return out[i] < out[j]
	})
	return out
}

// ManifestProcess is one traced process image in the run manifest.
type ManifestProcess struct {
	Pid            int      `json:"pid"`
	Ppid           int      `json:"ppid"`
	Cmdline        []string `json:"cmdline"`
	Folder         string   `json:"folder"`
	Main           bool     `json:"main"`
	Events         uint64   `json:"events_recorded"`
	Rows           uint64   `json:"rows_written"`
	Lost           uint64   `json:"events_lost"`
	Complete       bool     `json:"complete"`
	Ended          string   `json:"ended,omitempty"` // exit, crash, exec or killed (see Ended)
	ExitStatus     *int     `json:"exit_status,omitempty"`
	Exec           string   `json:"exec,omitempty"`
	ForkedUntraced int      `json:"forked_children_untraced"`
	Dump           string   `json:"dump,omitempty"`
	Error          string   `json:"error,omitempty"`
}

// Manifest is {output}/run_{timestamp}.json (SPEC §2).
type Manifest struct {
	RunID      string            `json:"run_id"`
	Command    []string          `json:"command"`
	MainPid    int               `json:"main_pid"`
	ExitStatus int               `json:"exit_status"`
	Processes  []ManifestProcess `json:"processes"`
}

// ManifestPrefix names the run manifests in an output folder.
const ManifestPrefix = "run_"

// LatestManifest reads the newest run manifest of an output folder.
func LatestManifest(output string) (*Manifest, error) {
	mans, _ := filepath.Glob(filepath.Join(output, ManifestPrefix+"*.json"))
	if len(mans) == 0 {
		return nil, fmt.Errorf("%s: no run manifest", output)
	}
	sort.Strings(mans)
	b, err := os.ReadFile(mans[len(mans)-1])
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v", mans[len(mans)-1], err)
	}
	return &m, nil
}

// MovedNote is the file a process of a run leaves in its first output folder
// when config(output=...) moved its capture elsewhere: it holds the new
// folder's path, and RunFolders follows it.
func MovedNote(output, runID string, pid int) string {
	return filepath.Join(output, fmt.Sprintf("%s%s_%d", movedPrefix, runID, pid))
}

// MovedNotes is the glob pattern of a run's MovedNote files.
func MovedNotes(output, runID string) string {
	return filepath.Join(output, movedPrefix+runID+"_*")
}

const movedPrefix = ".msmemscope_moved_"

// RunFolders finds the capture folders a run created, in the order their
// processes started; captures moved elsewhere (MovedNote) are followed.
func RunFolders(output, runID string) ([]string, []*ProcessMeta) {
	ents, _ := os.ReadDir(output)
	var dirs []string
	var metas []*ProcessMeta
	for _, e := range ents {
		d := filepath.Join(output, e.Name())
		if !e.IsDir() {
			if !strings.HasPrefix(e.Name(), movedPrefix+runID+"_") {
				continue
			}
			b, err := os.ReadFile(d)
			if err != nil {
				continue
			}
			d = string(b)
		}
		m, err := ReadMeta(d)
		if err != nil || m.RunID != runID {
			continue
		}
		dirs = append(dirs, d)
		metas = append(metas, m)
	}
	idx := make([]int, len(dirs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return metas[idx[a]].StartMonoNs < metas[idx[b]].StartMonoNs })
	sd, sm := make([]string, len(dirs)), make([]*ProcessMeta, len(dirs))
	for i, j := range idx {
		sd[i], sm[i] = dirs[j], metas[j]
	}
	return sd, sm
}
