package collect

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

// writeReports writes the analyses' report files and the watch report into
// the analysis folder, and prints their summaries, in the order of the
// analyses' table, the watch report last.
func writeReports(res *Result, runs []*run, stamp string, cfg config.Config, watch []spool.WatchFinding, console io.Writer) error {
	dir := filepath.Join(res.Dir, spool.AnalysisDir)
	say := func(s string) {
		if console != nil {
			fmt.Fprintf(console, "msmemscope: process %d (%s): %s", res.Meta.Pid, res.Meta.ProgName(), s)
		}
	}
	for _, r := range runs {
		path := ""
		if r.res.WriteCSV != nil {
			if err := safefs.EnsureDir(dir); err != nil {
				return err
			}
			path = uniquePath(filepath.Join(dir, r.res.File+stamp), ".csv")
			if err := safefs.WriteDerived(path, r.res.WriteCSV); err != nil {
				return err
			}
		}
		switch v := r.res.Value.(type) {
		case *analyzer.LeakReport:
			res.Leaks, res.LeaksPath = v, path
		case *analyzer.DecomposeReport:
			res.Decompose, res.DecomposePath = v, path
		case *analyzer.IneffReport:
			res.Inefficient = v
		}
		say(r.res.Summary(ConsoleTop))
	}
	if len(watch) > 0 { // (a range watched: whatever the last configuration says)
		if err := safefs.EnsureDir(dir); err != nil {
			return err
		}
		res.WatchPath = uniquePath(filepath.Join(dir, "watch_"+stamp), ".csv")
		if err := safefs.WriteDerived(res.WatchPath, func(w io.Writer) error { return writeWatch(w, watch) }); err != nil {
			return err
		}
		say(watchSummary(watch))
	}
	return nil
}

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
