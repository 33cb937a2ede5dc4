package main

import (
	"fmt"
	"os"

	"msmemscope/analyzer"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/internal/logx"
	"msmemscope/spool"
	"msmemscope/trace"
)

// timeline prints the peak timeline of an input and the per-site report at
// its peak (SPEC §7): any input spool.Find takes (analyzer.TimelineOf).
func timeline(inv *cli.Invocation) int {
	iv := uint64(inv.IntervalMs)
	in := inv.Inputs[0]
	found, err := spool.Find(in)
	if err != nil {
		return usage(fmt.Errorf("--input %v", err))
	}
	if found.Output {
		// An output folder: its main process (a program's children have
		// their own capture folders, named here).
		if n := len(spool.Captures(in)); n > 1 {
			logx.Warnf("--input %s holds %d traced processes: the timeline is the main one's (%s); give another's capture folder for its own", in, n, found.Capture)
		}
	}
	if !found.HasSpool() { // a file: one that is not an input is a usage error
		f, err := spool.Open(in, trace.OpenOptions{Lean: true})
		if err != nil {
			return usage(fmt.Errorf("--input %v", err))
		}
		f.Close()
	}
	// The timeline reads nothing but its input: an error is the input's
	// (cut short, damaged, empty), a usage error.
	tl, err := analyzer.TimelineOf(in, iv)
	if err != nil {
		return usage(err)
	}
	peak, ok := tl.Peak()
	if !ok {
		return usage(fmt.Errorf("--input %s holds no events", in))
	}
	rep, err := analyzer.ReportAtTime(in, tl, iv, peak.Ms)
	if err != nil {
		return usage(err)
	}
	analyzer.WriteTimeline(os.Stdout, tl, rep, peak.Ms)
	return 0
}
