// Package export writes a capture's events in the formats other tools read:
// pprof's profile.proto (go tool pprof, and every viewer that reads it), the
// Chrome JSON trace format (ui.perfetto.dev, chrome://tracing) and PyTorch's
// memory snapshot pickle (pytorch.org/memory_viz, torch.cuda._memory_viz).
// An exporter sees the conversion's one event stream, as the analyses do,
// and writes its file into the capture's export/ folder at the end.
package export

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"msmemscope/config"
	"msmemscope/internal/safefs"
	"msmemscope/trace"
)

// Dir is the folder of a capture (or of --output) that exports go to.
const Dir = "export"

// Writer is one format's exporter.
type Writer interface {
	Observe(e *trace.Event)
	// Name is the file's name before its stamp (profile_) and its extension.
	Name() (prefix, ext string)
	Encode(w io.Writer) error
}

// A Noter says what its file lacks, when it does ("" otherwise): a
// memory_viz snapshot of a capture with no tensor or device block.
type Noter interface{ Note() string }

// Notes are the writers' notes.
func (s *Set) Notes() []string {
	if s == nil {
		return nil
	}
	var out []string
	for _, w := range s.ws {
		if n, ok := w.(Noter); ok && n.Note() != "" {
			out = append(out, n.Note())
		}
	}
	return out
}

// New returns the exporter of a format of config.ExportFormats.
func New(format string) (Writer, error) {
	switch format {
	case "pprof":
		return newPprof(), nil
	case "perfetto":
		return newPerfetto(), nil
	case "html":
		return newHTML(), nil
	case "memory_viz":
		return newMemviz(), nil
	}
	return nil, fmt.Errorf("unknown export format %q (known: %v)", format, config.ExportFormats)
}

// kindsOf are the event kinds each format reads (a reader skips the other
// rows unparsed: a dump's ACCESS rows cost most to read, and no exporter
// shows them).
var kindsOf = map[string][]trace.Kind{
	"html":       {trace.KindMalloc, trace.KindFree, trace.KindSystem, trace.KindMstx, trace.KindOOM},
	"pprof":      {trace.KindMalloc, trace.KindFree},
	"perfetto":   {trace.KindMalloc, trace.KindFree, trace.KindSystem, trace.KindMstx, trace.KindOOM, trace.KindOpLaunch, trace.KindKernelLaunch},
	"memory_viz": {trace.KindMalloc, trace.KindFree, trace.KindOOM, trace.KindSnapshot},
}

// ReadOptions are the options to open an input with for exporting it in
// formats: only the rows they read, events recycled (exporters copy what
// they keep).
func ReadOptions(formats []string) trace.OpenOptions {
	var kinds []trace.Kind
	for _, f := range formats {
		k, ok := kindsOf[f]
		if !ok {
			return trace.OpenOptions{Reuse: true} // unknown: New says so
		}
		for _, x := range k {
			if !slices.Contains(kinds, x) {
				kinds = append(kinds, x)
			}
		}
	}
	return trace.OpenOptions{Reuse: true, Kinds: kinds}
}

// Set fans one event stream out to several exporters.
type Set struct{ ws []Writer }

// NewSet makes the exporters of formats (nil when there are none).
func NewSet(formats []string) (*Set, error) {
	if len(formats) == 0 {
		return nil, nil
	}
	s := &Set{}
	for _, f := range formats {
		w, err := New(f)
		if err != nil {
			return nil, err
		}
		s.ws = append(s.ws, w)
	}
	return s, nil
}

// Observe hands e to every exporter; a nil Set ignores it.
func (s *Set) Observe(e *trace.Event) {
	if s == nil {
		return
	}
	for _, w := range s.ws {
		w.Observe(e)
	}
}

// SetProcess names the process whose events the exporters see, for those
// that show it (a conversion's rows carry no pid).
func (s *Set) SetProcess(pid int64) {
	each(s, func(w interface{ SetProcess(int64) }) { w.SetProcess(pid) })
}

// SetCommand names the process's command line, for those that show it.
func (s *Set) SetCommand(cmd []string) {
	each(s, func(w interface{ SetCommand([]string) }) { w.SetCommand(cmd) })
}

// SetAnalyses hands the exporters that show them the analyses' results.
func (s *Set) SetAnalyses(a *Analyses) {
	each(s, func(w interface{ SetAnalyses(*Analyses) }) { w.SetAnalyses(a) })
}

// SetLeakKinds hands the exporters the leak kind of each block alive at the
// end (the scan at exit), for those that show it; nil: no scan ran.
func (s *Set) SetLeakKinds(kindOf func(allocID uint64) (string, bool)) {
	if kindOf != nil {
		each(s, func(w interface {
			SetLeakKinds(func(uint64) (string, bool))
		}) {
			w.SetLeakKinds(kindOf)
		})
	}
}

// each calls f with every exporter of s that is an I (a nil Set has none).
func each[I any](s *Set, f func(I)) {
	if s == nil {
		return
	}
	for _, w := range s.ws {
		if x, ok := w.(I); ok {
			f(x)
		}
	}
}

// Write writes every exporter's file into dir (made when missing), named
// {prefix}{stamp}{ext} without overwriting anything, and returns the paths.
func (s *Set) Write(dir, stamp string) ([]string, error) {
	if s == nil {
		return nil, nil
	}
	var paths []string
	for _, w := range s.ws {
		prefix, ext := w.Name()
		p, err := writeFile(dir, prefix+stamp, ext, w.Encode)
		if err != nil {
			return paths, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// writeFile writes dir/{name}{ext} (dir made when missing), numbered
// rather than overwriting anything, and returns its path.
func writeFile(dir, name, ext string, encode func(io.Writer) error) (string, error) {
	if err := safefs.EnsureDir(dir); err != nil {
		return "", err
	}
	p := safefs.FreeName(safefs.Numbered(filepath.Join(dir, name), ext))
	return p, safefs.WriteDerived(p, encode)
}

// File exports an input's events (any input spool.Open reads: a dump file,
// a capture folder's newest dump or its spool, a rotated log) into dir,
// stamped with the time now; it returns the paths written.
func File(in trace.Input, dir string, formats []string) (paths, notes []string, err error) {
	set, err := NewSet(formats)
	if err != nil {
		return nil, nil, err
	}
	for {
		e, err := in.Next()
		if err != nil {
			return nil, nil, &InputError{err}
		}
		if e == nil {
			break
		}
		set.Observe(e)
	}
	paths, err = set.Write(dir, safefs.Stamp(time.Now()))
	return paths, set.Notes(), err
}

// InputError is a failure to read File's input (a file cut short or
// damaged), as opposed to one writing the export.
type InputError struct{ Err error }

func (e *InputError) Error() string { return e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }
