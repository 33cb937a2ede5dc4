package spool

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"msmemscope/config"
	"msmemscope/trace"
)

// Every input a user names (--input, input_path, the C API's input) is found
// here: an output folder (its one capture, or the main process of its newest
// run manifest), a capture folder or its spool folder (its newest dump, else
// its spool or rotated logs), a dump file (CSV or SQLite), a spool file or
// one rotated log.

// Found is what an input path names.
type Found struct {
	// Capture is the capture folder, "" for a file outside one.
	Capture string
	// File is the file to read alone: a dump file, a spool file or a
	// rotated log; "" for a capture folder.
	File string
	// Output: path is an output folder, and Capture the capture it names
	// (its only one, or its newest run's main process).
	Output bool
}

// HasSpool reports whether the input is a capture folder with its spool.
func (f Found) HasSpool() bool { return f.File == "" && IsCapture(f.Capture) }

// Find says what path names. A folder must be a capture folder (with its
// spool or dump files) or an output folder that names one; any file is
// taken as it is and told apart by content when opened.
func Find(path string) (Found, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Found{}, fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() {
		// (a FIFO would block the first read, a device never end)
		return Found{}, fmt.Errorf("%s: not a regular file", path)
	}
	if !fi.IsDir() {
		f := Found{File: path}
		// A spool or log inside a capture folder: its maps symbolize.
		if d := filepath.Dir(path); filepath.Base(d) == SpoolDir {
			if err := DamagedMeta(filepath.Dir(d)); err != nil {
				return Found{}, err
			}
			if IsCapture(filepath.Dir(d)) {
				f.Capture = filepath.Dir(d)
			}
		}
		return f, nil
	}
	if err := DamagedMeta(path); err != nil {
		return Found{}, err
	}
	if IsCapture(path) || len(DumpFiles(path)) > 0 {
		return Found{Capture: path}, nil
	}
	if up := filepath.Dir(filepath.Clean(path)); filepath.Base(filepath.Clean(path)) == SpoolDir {
		if err := DamagedMeta(up); err != nil {
			return Found{}, err
		}
		if IsCapture(up) {
			return Found{Capture: up}, nil // the folder of the spool or the rotated logs
		}
	}
	d, err := mainCapture(path)
	if err != nil {
		return Found{}, err
	}
	return Found{Capture: d, Output: true}, nil
}

// DamagedMeta says when dir holds a spool (or rotated logs) whose
// process.json cannot be read: a capture folder all the same, which must
// not be taken for a folder of dump files (its analyses would read the old
// dump, its leak kinds lost, without a word).
// Its error wraps ErrDamaged.
func DamagedMeta(dir string) error {
	_, serr := os.Stat(filepath.Join(dir, SpoolDir, FileName))
	if serr != nil && len(LogFiles(dir)) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, SpoolDir, ProcessFile)); err != nil {
		return nil // none written (a run killed as it began, a spool copied out): not a capture
	}
	if _, err := ReadMeta(dir); err != nil {
		return fmt.Errorf("%s: %w: %v", dir, ErrDamaged, err)
	}
	return nil
}

// ErrDamaged is a capture whose spool/process.json cannot be read.
var ErrDamaged = errors.New("the capture is damaged")

// DamagedIn lists the damaged captures directly inside dir (DamagedMeta).
func DamagedIn(dir string) []error {
	var out []error
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if err := DamagedMeta(filepath.Join(dir, e.Name())); e.IsDir() && err != nil {
			out = append(out, err)
		}
	}
	return out
}

// mainCapture picks the capture of an output folder: the only one (a folder
// with a spool or with dump files), or the main process of its newest run
// manifest.
func mainCapture(dir string) (string, error) {
	var found []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		d := filepath.Join(dir, e.Name())
		if e.IsDir() && DamagedMeta(d) == nil && (IsCapture(d) || len(DumpFiles(d)) > 0) {
			found = append(found, d)
		}
	}
	if damaged := DamagedIn(dir); len(found) == 0 && len(damaged) > 0 {
		return "", damaged[0] // said when it is the only one
	}
	if len(found) == 1 {
		return found[0], nil
	}
	if m, err := LatestManifest(dir); err == nil {
		for _, p := range m.Processes {
			if p.Main && p.Folder != "" {
				return p.Folder, nil
			}
		}
	}
	return "", fmt.Errorf("%s holds %d captures: name one msmemscope_{pid}_{timestamp} folder", dir, len(found))
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// FormatSpool is the Format of an input decoded from a spool or rotated logs.
const FormatSpool = "spool"

// Open opens any input (see Find) as one stream of dump events: a capture
// folder's newest dump file, else its spool (or rotated logs), decoded into
// the rows, in the order and with the ids, its dump would have (PyTorch rows
// included; --steps filtering aside). opt applies to dump files
// as trace.Open says; on a spool, Kinds filters rows too.
func Open(path string, opt trace.OpenOptions) (trace.Input, error) {
	f, err := Find(path)
	if err != nil {
		return nil, err
	}
	if f.File == "" {
		if dumps := DumpFiles(f.Capture); len(dumps) > 0 && !(opt.Capture && f.HasSpool()) {
			return trace.Open(dumps[len(dumps)-1], opt)
		}
		return openSpoolInput(f, opt)
	}
	if IsSpoolFile(f.File) {
		return openSpoolInput(f, opt)
	}
	return trace.Open(f.File, opt)
}

// IsSpoolFile tells a raw spool or a rotated log by its first bytes.
func IsSpoolFile(path string) bool {
	b := firstBytes(path)
	return string(b) == Magic || isZstd(b)
}

// IsLogFile tells a rotated log (zstd frames) by its first bytes.
func IsLogFile(path string) bool { return isZstd(firstBytes(path)) }

func isZstd(b []byte) bool { return len(b) >= 4 && string(b[:4]) == "\x28\xb5\x2f\xfd" } // a zstd frame's magic

// firstBytes is a file's first 8 bytes, fewer if it is shorter.
func firstBytes(path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var b [8]byte
	n, _ := io.ReadFull(f, b[:])
	return b[:n]
}

// spoolInput is a spool decoded as a trace.Input.
type spoolInput struct {
	found Found
	sp    *Spool
	dec   *Decoder
	opt   trace.OpenOptions
	maps  string
	torch bool        // PyTorch records become rows, as in the dump
	ev    trace.Event // the event Next fills when events are reused (opt.Reuse)
}

func openSpoolInput(f Found, opt trace.OpenOptions) (*spoolInput, error) {
	in := &spoolInput{found: f, opt: opt, torch: true}
	var err error
	if in.sp, in.dec, err = in.open(); err != nil {
		return nil, err
	}
	return in, nil
}

// open opens and indexes the spool, and starts a decoder at its beginning.
func (in *spoolInput) open() (*Spool, *Decoder, error) {
	var meta *ProcessMeta
	if in.found.Capture != "" {
		m, err := ReadMeta(in.found.Capture)
		if err != nil {
			return nil, nil, fmt.Errorf("%s is not a capture folder: %v", in.found.Capture, err)
		}
		meta = m
	}
	// A spool whose process ended normally (or that stands alone, where
	// nothing says it may be cut) must be whole; only a killed run's may
	// end inside a chunk. A rotating capture's logs read together are
	// judged as its conversion judges them.
	var end *EndMeta
	if in.found.Capture != "" {
		end = ReadEnd(in.found.Capture) // (before the spool: see Convert)
	}
	// (A capture whose spool writes failed may end inside a chunk, as a
	// killed run's.)
	whole := in.found.Capture == "" || end.SpoolWhole()
	var sp *Spool
	var err error
	switch {
	case in.found.File == "":
		sp, err = OpenCaptureEnded(in.found.Capture, end) // (judged by end there)
	case strings.HasSuffix(in.found.File, LogSuffix) && whole:
		sp, err = OpenWholeLog(in.found.File)
	case strings.HasSuffix(in.found.File, LogSuffix):
		sp, err = OpenLog(in.found.File)
	default:
		sp, err = OpenFile(in.found.File)
		if err == nil && whole {
			if filepath.Base(in.found.File) != FileName {
				end = nil // (end.json gives spool.bin's size)
			}
			if err = sp.Damaged(in.found.File, end); err != nil {
				sp.Close()
			}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	if meta == nil {
		meta = spoolMeta(sp)
	}
	dec := NewDecoder(sp, in.found.Capture, meta, meta.Config)
	dec.FollowConfig()
	dec.SymbolizeWith("", in.maps)
	if in.torch {
		if err := dec.DecodeTorch(); err != nil {
			sp.Close()
			return nil, nil, err
		}
	}
	return sp, dec, nil
}

// spoolMeta is what a spool file outside a capture folder says of itself.
func spoolMeta(sp *Spool) *ProcessMeta {
	m := &ProcessMeta{Pid: sp.Pid, Config: config.Default()}
	if sp.Py.Config != "" {
		if c, err := config.Decode(sp.Py.Config); err == nil {
			m.Config = c
		}
	}
	return m
}

func (in *spoolInput) Next() (*trace.Event, error) {
	for {
		var e *trace.Event
		var err error
		if in.opt.Reuse {
			e, err = in.dec.NextInto(&in.ev) // each event valid until the next
		} else {
			e, err = in.dec.Next()
		}
		if e == nil || err != nil {
			return nil, err
		}
		if len(in.opt.Kinds) == 0 || slices.Contains(in.opt.Kinds, e.Kind) {
			return e, nil
		}
	}
}

func (in *spoolInput) Path() string {
	if in.found.File != "" {
		return in.found.File
	}
	return in.found.Capture
}

func (in *spoolInput) Format() string { return FormatSpool }

// Progress counts records: done of the spool's total.
func (in *spoolInput) Progress() (int64, int64) {
	return int64(in.dec.Records()), int64(in.sp.Records)
}

// Lookup decodes the spool again: rows are numbered the same every time.
func (in *spoolInput) Lookup(ids []uint64, fn func(*trace.Event) error) error {
	if len(ids) == 0 {
		return nil
	}
	sp, dec, err := in.open()
	if err != nil {
		return err
	}
	defer sp.Close()
	for len(ids) > 0 {
		e, err := dec.Next()
		if err != nil {
			return err
		}
		if e == nil {
			return nil
		}
		for len(ids) > 0 && ids[0] < e.ID {
			ids = ids[1:]
		}
		if len(ids) > 0 && ids[0] == e.ID {
			if err := fn(e); err != nil {
				return err
			}
			ids = ids[1:]
		}
	}
	return nil
}

// Offset is -1: spool rows have no place in a file.
func (in *spoolInput) Offset() int64 { return -1 }

func (in *spoolInput) Close() error { return in.sp.Close() }

// OpenStream decodes a capture folder's spool as a stream of its memory and
// mstx events (PyTorch records are skipped, unlike Open: the live report and
// the timeline need blocks only). Close it when done.
func OpenStream(dir string) (trace.Stream, func() error, error) { return OpenStreamMaps(dir, "") }

// OpenStreamMaps is OpenStream for a capture still being recorded: maps is
// the process's current /proc/self/maps text, used to symbolize.
func OpenStreamMaps(dir, maps string) (trace.Stream, func() error, error) {
	in := &spoolInput{found: Found{Capture: dir}, maps: maps}
	var err error
	if in.sp, in.dec, err = in.open(); err != nil {
		return nil, nil, err
	}
	return in, in.Close, nil
}

// OpenLogStream is OpenStream for one rotated log of capture dir alone.
func OpenLogStream(dir, path string) (trace.Stream, func() error, error) {
	in := &spoolInput{found: Found{Capture: dir, File: path}}
	var err error
	if in.sp, in.dec, err = in.open(); err != nil {
		return nil, nil, err
	}
	return in, in.Close, nil
}
