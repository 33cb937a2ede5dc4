package main

import (
	"fmt"
	"os"

	"msmemscope/analyzer"
	"msmemscope/cmd/msmemscope/cli"
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
