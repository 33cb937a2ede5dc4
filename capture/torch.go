package capture

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/config"
	"msmemscope/internal/safefs"
	"msmemscope/spool"
)

// writeWatch writes the watch report: which launch changed watched memory.
func writeWatch(w io.Writer, findings []spool.WatchFinding) error {
	var sb strings.Builder
	sb.WriteString("Launch,Row ID,Operator,Status,Tensor,Hash Before,Hash After\n")
	for _, f := range findings {
		fmt.Fprintf(&sb, "%d,%d,%s,%s,%s,%s,%s\n", f.Launch, f.Row, f.Operator, f.Status, f.Tensor, f.Before, f.After)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

func watchSummary(findings []spool.WatchFinding) string {
	var sb strings.Builder
	n := 0
	for _, f := range findings {
		if f.Status == "changed" {
			n++
		}
	}
	fmt.Fprintf(&sb, "watch: %d change(s) of watched memory\n", n)
	for _, f := range findings {
		if f.Status == "changed" {
			fmt.Fprintf(&sb, "  %s (launch %d, row %d) changed %s\n", f.Operator, f.Launch, f.Row, f.Tensor)
		}
	}
	return sb.String()
}

// writeTorchReports writes and prints the decompose summary and the watch
// report into the analysis folder.
func writeTorchReports(res *Result, dir, stamp string, cfg config.Config, watch []spool.WatchFinding, decomp *analyzer.DecomposeAnalyzer, console io.Writer) error {
	if cfg.HasAnalysis("decompose") {
		rep := decomp.Finish()
		res.Decompose = rep
		if err := safefs.EnsureDir(filepath.Join(dir, spool.AnalysisDir)); err != nil {
			return err
		}
		res.DecomposePath = uniquePath(filepath.Join(dir, spool.AnalysisDir, "decompose_"+stamp), ".csv")
		if err := safefs.WriteNew(res.DecomposePath, rep.WriteCSV); err != nil {
			return err
		}
		if console != nil {
			fmt.Fprintf(console, "msmemscope: process %d (%s): %s", res.Meta.Pid, progName(res.Meta), rep.Summary())
		}
	}
	if cfg.Watch != nil && len(watch) > 0 {
		if err := safefs.EnsureDir(filepath.Join(dir, spool.AnalysisDir)); err != nil {
			return err
		}
		res.WatchPath = uniquePath(filepath.Join(dir, spool.AnalysisDir, "watch_"+stamp), ".csv")
		if err := safefs.WriteNew(res.WatchPath, func(w io.Writer) error { return writeWatch(w, watch) }); err != nil {
			return err
		}
		if console != nil {
			fmt.Fprintf(console, "msmemscope: process %d (%s): %s", res.Meta.Pid, progName(res.Meta), watchSummary(watch))
		}
	}
	return nil
}
