package libmemscope

// The offline API of SPEC §6 for the Python package (msmemscope.offline):
// list_analyzers, get_analyzer_config and analyze, run by the Go analyses
// over CSV or SQLite dumps. capi/ exports these behind C shims and turns
// what they return into the C API's one reply (include/msmemscope.h); an
// error's analyzer.ErrorKind names the Python exception it becomes.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/config"
	"msmemscope/export"
	"msmemscope/spool"
)

// ListAnalyzers is ["leaks", ...].
func ListAnalyzers() []string {
	return analyzer.ListAnalyzers()
}

// AnalyzerConfig is an analyzer's parameters: {"params": {name: {"type",
// "required", "default", "description"}}, "order": the parameter names in
// order}.
func AnalyzerConfig(name string) (any, error) {
	cfg, err := analyzer.AnalyzerConfig(name)
	if err != nil {
		return nil, err
	}
	order, _ := analyzer.AnalyzerParams(name)
	return map[string]any{"params": cfg, "order": order}, nil
}

// Analyze runs analyzer name with kwargs, a JSON object of keyword
// arguments: the structured result and the console report.
func Analyze(name, kwargs string) (*analyzer.Result, error) {
	var args map[string]any
	d := json.NewDecoder(bytes.NewReader([]byte(kwargs)))
	d.UseNumber()
	if err := d.Decode(&args); err != nil {
		return nil, &analyzer.ArgError{Kind: "TypeError", Msg: "keyword arguments must be a JSON object: " + err.Error()}
	}
	return analyzer.RunAnalyzer(name, args, analyzer.NewProgress(analyzer.Label(name)))
}

// Export writes input's events (a dump file, a capture or output folder, a
// spool or rotated log) in formats (config.ExportFormats; empty: all) into
// output/export, or, without output, into the capture's export folder (the
// input's own folder for a file outside a capture). It returns the paths,
// and what a file lacks (an empty memory_viz snapshot), one line each.
func Export(input string, formats []string, output string) (paths []string, notes string, err error) {
	if len(formats) == 0 {
		formats = config.ExportFormats
	}
	for _, f := range formats {
		if !slices.Contains(config.ExportFormats, f) {
			return nil, "", fmt.Errorf("unknown export format %q: the formats are %s", f, strings.Join(config.ExportFormats, ", "))
		}
	}
	if _, err := os.Stat(input); err != nil {
		return nil, "", err
	}
	dir := output
	if dir == "" {
		dir = input
		if fi, err := os.Stat(input); err == nil && !fi.IsDir() {
			dir = filepath.Dir(input)
			if b := filepath.Base(dir); b == spool.DumpDir || b == spool.SpoolDir {
				dir = filepath.Dir(dir) // a capture's file: the capture's folder
			}
		}
	}
	in, err := spool.Open(input, export.ReadOptions(formats))
	if err != nil {
		return nil, "", err
	}
	defer in.Close()
	paths, ns, err := export.File(in, filepath.Join(dir, export.Dir), formats)
	for _, n := range ns {
		notes += n + "\n"
	}
	return paths, notes, err
}
