package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"msmemscope/analyzer"
	"msmemscope/analyzer/spec"
	"msmemscope/capture"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/collect"
	"msmemscope/config"
	"msmemscope/internal/safefs"
	"msmemscope/trace"
)

// Offline work on dump files (SPEC §5, §5.2): --compare of two captures, and
// --input=FILE (a memscope_dump CSV or DB) with --analysis and --data-format.
// Every input is read through a trace.Stream: a dump file with trace.Open, a
// capture that has only its spool with capture.OpenStream.

// inputError is a bad input (a path, a malformed file): a usage error.
type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }
func (e *inputError) Unwrap() error { return e.err }

func badInput(err error) error {
	if err == nil {
		return nil
	}
	return &inputError{err}
}

// exitFor is the exit code for err: 2 for a bad input, 1 otherwise.
func exitFor(err error) int {
	var ie *inputError
	if errors.As(err, &ie) {
		return usage(err)
	}
	return fail(err)
}

// dumpFiles lists the dump files of a capture folder, newest last.
func dumpFiles(dir string) []string {
	var out []string
	for _, pat := range []string{"memscope_dump_*.csv", "memscope_dump_*.db"} {
		m, _ := filepath.Glob(filepath.Join(dir, capture.DumpDir, pat))
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

// mainCapture picks the capture of an output folder: the only one (a folder
// with a spool or with dump files), or the main process of its newest run
// manifest.
func mainCapture(in string) (string, error) {
	var found []string
	ents, _ := os.ReadDir(in)
	for _, e := range ents {
		d := filepath.Join(in, e.Name())
		if !e.IsDir() {
			continue
		}
		if _, err := capture.ReadMeta(d); err == nil || len(dumpFiles(d)) > 0 {
			found = append(found, d)
		}
	}
	if len(found) == 1 {
		return found[0], nil
	}
	mans, _ := filepath.Glob(filepath.Join(in, "run_*.json"))
	sort.Strings(mans)
	if len(mans) > 0 {
		if b, err := os.ReadFile(mans[len(mans)-1]); err == nil {
			var m Manifest
			if json.Unmarshal(b, &m) == nil {
				for _, p := range m.Processes {
					if p.Main && p.Folder != "" {
						return p.Folder, nil
					}
				}
			}
		}
	}
	return "", fmt.Errorf("%s holds %d captures: name one msmemscope_{pid}_{timestamp} folder", in, len(found))
}

// streamInput is an opened input.
type streamInput struct {
	name  string
	s     trace.Stream
	close func() error
	prog  analyzer.Source // nil when progress is unknown
}

// openInput opens --input path for reading: a dump file; a capture folder
// (its newest dump file, else its spool); an output folder holding one
// capture or a run manifest naming the main one.
func openInput(in string) (*streamInput, error) {
	fi, err := os.Stat(in)
	if err != nil {
		return nil, badInput(fmt.Errorf("--input %s: %v", in, errors.Unwrap(err)))
	}
	if !fi.IsDir() {
		f, err := trace.Open(in, trace.OpenOptions{Lean: true, Reuse: true,
			Kinds: []trace.Kind{trace.KindOpLaunch, trace.KindKernelLaunch, trace.KindMalloc, trace.KindFree}})
		if err != nil {
			return nil, badInput(err)
		}
		return &streamInput{name: in, s: f, close: f.Close, prog: f}, nil
	}
	dir := in
	if _, err := capture.ReadMeta(in); err != nil && len(dumpFiles(in)) == 0 {
		if dir, err = mainCapture(in); err != nil {
			return nil, badInput(fmt.Errorf("--input %v", err))
		}
	}
	if dumps := dumpFiles(dir); len(dumps) > 0 {
		return openInput(dumps[len(dumps)-1])
	}
	s, closeFn, err := capture.OpenStream(dir)
	if err != nil {
		return nil, badInput(fmt.Errorf("--input %v", err))
	}
	return &streamInput{name: dir, s: s, close: closeFn}, nil
}

// compare is msmemscope --compare --input=BASE,COMPARE [--output=DIR].
func compare(inv *cli.Invocation) int {
	cm := analyzer.NewComparer()
	var seqs []*analyzer.LaunchSeq
	prog := analyzer.NewProgress("compare")
	for _, in := range inv.Inputs {
		si, err := openInput(in)
		if err != nil {
			prog.Done()
			return exitFor(err)
		}
		if si.prog != nil {
			prog.Track(si.prog)
		}
		seq, err := cm.Launches(si.s, si.name)
		si.close()
		if err != nil {
			prog.Done()
			return exitFor(badInput(err))
		}
		seqs = append(seqs, seq)
	}
	prog.Done()
	r, err := cm.Compare(seqs[0], seqs[1])
	if err != nil {
		return exitFor(badInput(err))
	}
	dir := filepath.Join(inv.Config.Output, "compare")
	if err := safefs.EnsureDir(dir); err != nil {
		return usage(fmt.Errorf("--output %s: %v", inv.Config.Output, err))
	}
	path, err := writeUnique(dir, "memory_compare_", ".csv", r.WriteCSV)
	if err != nil {
		return fail(err)
	}
	fmt.Print(r.Summary(10))
	fmt.Printf("msmemscope: comparison written to %s\n", path)
	return 0
}

// writeUnique writes a new file dir/prefix{timestamp}ext, adding
// milliseconds and then a counter when the name is taken.
func writeUnique(dir, prefix, ext string, write func(io.Writer) error) (string, error) {
	now := time.Now()
	stamp := capture.Stamp(now)
	for i := 0; ; i++ {
		name := prefix + stamp + ext
		switch {
		case i == 1:
			name = fmt.Sprintf("%s%s%03d%s", prefix, stamp, now.Nanosecond()/1e6, ext)
		case i > 1:
			name = fmt.Sprintf("%s%s%03d_%d%s", prefix, stamp, now.Nanosecond()/1e6, i-1, ext)
		}
		p := filepath.Join(dir, name)
		err := safefs.WriteNew(p, write)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, os.ErrExist) || i > 100 {
			return "", err
		}
	}
}

// offlineFile runs --analysis on a dump file (and, with --data-format naming
// the other format, writes a copy in that format beside it). The analyses
// that read rows go over the file in one pass and write their reports; one
// that annotates rows adds its results to the file itself, as its offline
// call (check_inefficient) does.
func offlineFile(inv *cli.Invocation, path string) int {
	format, err := trace.DetectFormat(path)
	if err != nil {
		return usage(fmt.Errorf("--input %s: %v", path, errors.Unwrap(err)))
	}
	// Reports go to the capture's analysis folder when the file is in a
	// capture's dump folder, else to --output.
	outDir := filepath.Join(inv.Config.Output, capture.AnalysisDir)
	if d := filepath.Dir(path); filepath.Base(d) == capture.DumpDir && !inv.Set["output"] {
		outDir = filepath.Join(filepath.Dir(d), capture.AnalysisDir)
	}
	options := config.Default().Analysis
	if inv.Set["analysis"] {
		options = inv.Config.Analysis
	}
	if inv.Set["data-format"] && inv.Config.DataFormat != format {
		out, rows, err := exportDump(path, inv.Config.DataFormat)
		if err != nil {
			return exitFor(err)
		}
		fmt.Fprintf(os.Stderr, "msmemscope: %s: %d rows -> %s\n", path, rows, out)
	}
	var readers []*spec.Analysis
	var as []analyzer.Analysis
	var annotators []*spec.Analysis
	for _, o := range options {
		s := spec.ByOption(o)
		if s.Annotates {
			annotators = append(annotators, s)
			continue
		}
		a, err := analyzer.New(s.Name, nil, path)
		if err != nil {
			return fail(err)
		}
		readers, as = append(readers, s), append(as, a)
	}
	if len(as) > 0 {
		if err := fileReports(path, outDir, options, readers, as); err != nil {
			return exitFor(err)
		}
	}
	for _, s := range annotators {
		r, err := analyzer.RunAnalyzer(s.Offline, map[string]any{spec.InputParam: path}, analyzer.NewProgress(analyzer.Label(s.Offline)))
		if err != nil {
			return exitFor(badInput(err))
		}
		fmt.Fprint(os.Stderr, "msmemscope: ", r.Summary(collect.ConsoleTop))
	}
	return 0
}

// fileReports runs analyses that read rows over a dump file in one pass
// and writes their reports.
func fileReports(path, outDir string, options []string, specs []*spec.Analysis, as []analyzer.Analysis) error {
	res, err := analyzer.RunFileAll(path, specs, as, analyzer.NewProgress(strings.Join(options, ",")))
	if err != nil {
		return badInput(err)
	}
	for i, r := range res {
		fmt.Fprintf(os.Stderr, "msmemscope: %s: %s", path, r.Summary(collect.ConsoleTop))
		if r.WriteCSV == nil {
			continue
		}
		if err := safefs.EnsureDir(outDir); err != nil {
			return fmt.Errorf("--output: %v", err)
		}
		p, err := writeUnique(outDir, r.File, ".csv", r.WriteCSV)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "msmemscope: %s report written to %s\n", specs[i].Option, p)
	}
	return nil
}

// exportDump writes a copy of a dump file in the other format beside it.
func exportDump(path, format string) (string, uint64, error) {
	in, err := trace.Open(path, trace.OpenOptions{Reuse: true})
	if err != nil {
		return "", 0, badInput(err)
	}
	defer in.Close()
	base := strings.TrimSuffix(path, filepath.Ext(path))
	out := base + "." + format
	for i := 1; ; i++ {
		if _, err := os.Lstat(out); os.IsNotExist(err) {
			break
		}
		out = fmt.Sprintf("%s_%d.%s", base, i, format)
	}
	prog := analyzer.NewProgress("export")
	defer prog.Done()
	prog.Track(in)
	rows, err := collect.WriteDump(out, collect.DumpOptions{Format: format}, func(w collect.RowWriter) error {
		for {
			e, err := in.Next()
			if err != nil {
				return badInput(err)
			}
			if e == nil {
				return nil
			}
			if err := w.Write(e); err != nil {
				return err
			}
		}
	})
	if err != nil {
		return "", 0, err
	}
	return out, rows, nil
}
