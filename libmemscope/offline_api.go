package libmemscope

// The offline API of SPEC §6 for the Python package (msmemscope.offline):
// list_analyzers, get_analyzer_config and analyze, run by the Go analyses
// over CSV or SQLite dumps. capi/ exports these behind C shims and turns
// what they return into the C API's one reply (include/msmemscope.h); an
// error's analyzer.ErrorKind names the Python exception it becomes.

import (
	"bytes"
	"encoding/json"

	"msmemscope/analyzer"
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
