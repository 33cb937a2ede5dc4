package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"msmemscope/analyzer"
	"msmemscope/analyzer/spec"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/collect"
	"msmemscope/config"
	"msmemscope/export"
	"msmemscope/internal/logx"
	"msmemscope/internal/safefs"
	"msmemscope/spool"
	"msmemscope/trace"
)

// Offline work on files (SPEC §5, §5.2): --compare of two captures, and
// --input=FILE (a memscope_dump CSV or DB, or a spool or log outside its
// capture folder) with --analysis and --data-format.
// Every input is found and opened by spool.Open, as one trace.Input.

// exitFor is the exit code for err: 2 for a bad input, 1 otherwise.
func exitFor(err error) int {
	if collect.IsInputError(err) {
		return usage(err)
	}
	return fail(err)
}

// openInput opens a --compare input for reading (spool.Open: a dump file, a
// capture folder, an output folder, a spool or a rotated log); a capture
// folder's whole spool, as --timeline reads it, not its newest dump, which
// --steps may have filtered.
func openInput(in string) (trace.Input, error) {
	f, err := spool.Open(in, trace.OpenOptions{Lean: true, Reuse: true, Capture: true,
		Kinds: []trace.Kind{trace.KindOpLaunch, trace.KindKernelLaunch, trace.KindMalloc, trace.KindFree,
			trace.KindMstx, trace.KindSystem}}) // the last two for the launches' steps
	if err != nil {
		return nil, collect.BadInput(fmt.Errorf("--input %v", err))
	}
	return f, nil
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
		prog.Track(si)
		seq, err := cm.Launches(si, si.Path())
		si.Close()
		if err != nil {
			prog.Done()
			return exitFor(collect.BadInput(err))
		}
		seqs = append(seqs, seq)
	}
	prog.Done()
	r, err := cm.Compare(seqs[0], seqs[1])
	if err != nil {
		return exitFor(collect.BadInput(err))
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
	if slices.Contains(inv.Config.Export, "html") { // the comparison as a page (other formats are a capture's)
		p, err := export.RunReport(filepath.Join(inv.Config.Output, export.Dir), safefs.Stamp(time.Now()), nil, r)
		if err != nil {
			return fail(err)
		}
		fmt.Printf("msmemscope: comparison report written to %s\n", p)
	}
	return 0
}

// writeUnique writes a new file dir/prefix{timestamp}ext, adding
// milliseconds and then a counter when the name is taken.
func writeUnique(dir, prefix, ext string, write func(io.Writer) error) (string, error) {
	return safefs.CreateUnique(safefs.Stamped(filepath.Join(dir, prefix), ext, time.Now()),
		func(p string) error { return safefs.WriteDerived(p, write) })
}

// offlineFile runs --analysis on a dump file (and, with --data-format naming
// the other format, writes a copy in that format beside it, or in --output
// when given). The analyses
// that read rows go over the file in one pass and write their reports; one
// that annotates rows adds its results to the file itself, as its offline
// call (check_inefficient) does.
func offlineFile(inv *cli.Invocation, path string) int {
	format, err := trace.DetectFormat(path)
	if err != nil {
		return usage(fmt.Errorf("--input %s: %v", path, errors.Unwrap(err)))
	}
	if spool.IsSpoolFile(path) {
		format = spool.FormatSpool // a spool or rotated log outside its capture folder
	}
	// Reports go to the capture's analysis folder when the file is in a
	// capture's dump or spool folder (a rotated log read alone), else to
	// --output.
	outDir := filepath.Join(inv.Config.Output, spool.AnalysisDir)
	exportDir := filepath.Join(inv.Config.Output, export.Dir)
	if d := filepath.Dir(path); (filepath.Base(d) == spool.DumpDir || filepath.Base(d) == spool.SpoolDir) && !inv.Set["output"] {
		outDir = filepath.Join(filepath.Dir(d), spool.AnalysisDir)
		exportDir = filepath.Join(filepath.Dir(d), export.Dir)
	}
	if inv.Set["export"] {
		if err := exportFile(path, exportDir, inv.Config.Export); err != nil {
			return exitFor(err)
		}
		if !inv.Set["analysis"] {
			return 0 // --export alone: no default analysis
		}
	}
	options := config.Default().Analysis
	if inv.Set["analysis"] {
		options = inv.Config.Analysis
	}
	if inv.Set["data-format"] && inv.Config.DataFormat != format {
		dir := "" // beside the input, unless --output names a folder
		if inv.Set["output"] {
			dir = inv.Config.Output
		}
		out, rows, err := exportDump(path, dir, inv.Config.DataFormat)
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
	if len(annotators) > 0 && format == spool.FormatSpool {
		return usage(fmt.Errorf("--input %s: --analysis=%s adds its results to a dump's rows: give the capture folder or its dump file, not a lone spool", path, annotators[0].Option))
	}
	if len(as) > 0 {
		if err := fileReports(path, outDir, options, readers, as); err != nil {
			return exitFor(err)
		}
	}
	for _, s := range annotators {
		r, err := analyzer.RunAnalyzer(s.Offline, map[string]any{spec.InputParam: path}, analyzer.NewProgress(analyzer.Label(s.Offline)))
		if err != nil {
			return exitFor(collect.BadInput(err))
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
		return collect.BadInput(err)
	}
	aLog := spool.IsLogFile(path)
	for i, r := range res {
		if lr, ok := r.Value.(*analyzer.LeakReport); ok && aLog {
			lr.EndName = "at the log's end" // (not the run's, unless it is the newest log)
		}
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

// exportFile writes a dump file's events in the --export formats into dir.
func exportFile(path, dir string, formats []string) error {
	in, err := spool.Open(path, export.ReadOptions(formats))
	if err != nil {
		return collect.BadInput(err)
	}
	defer in.Close()
	paths, notes, err := export.File(in, dir, formats)
	for _, p := range paths {
		fmt.Fprintf(os.Stderr, "msmemscope: %s: export written to %s\n", path, p)
	}
	for _, n := range notes {
		logx.Warnf("%s: %s", path, n)
	}
	if ie := (*export.InputError)(nil); errors.As(err, &ie) {
		return collect.BadInput(err)
	}
	return err
}

// exportDump writes a copy of a dump file in the other format, in dir
// ("": beside it).
func exportDump(path, dir, format string) (string, uint64, error) {
	in, err := spool.Open(path, trace.OpenOptions{Reuse: true})
	if err != nil {
		return "", 0, collect.BadInput(err)
	}
	defer in.Close()
	base := strings.TrimSuffix(path, filepath.Ext(path))
	if dir != "" {
		base = filepath.Join(dir, filepath.Base(base))
	}
	out := safefs.FreeName(safefs.Numbered(base, "."+format))
	prog := analyzer.NewProgress("export")
	defer prog.Done()
	prog.Track(in)
	rows, err := collect.WriteDump(out, collect.DumpOptions{Format: format}, func(w collect.RowWriter) error {
		for {
			e, err := in.Next()
			if err != nil {
				return collect.BadInput(err)
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
