package main

import (
	"fmt"
	"os"

	"msmemscope/analyzer"
	"msmemscope/capture"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/spool"
	"msmemscope/trace"
)

// timeline prints the peak timeline of an input and the per-site report at
// its peak (SPEC §7). A capture is read from its spool (rotating logs are
// parsed in parallel); any other input (a dump CSV or DB, a spool file, a
// rotated log) is read as the stream spool.Open gives, twice: the report at
// the peak replays it.
func timeline(inv *cli.Invocation) int {
	iv := uint64(inv.IntervalMs)
	in := inv.Inputs[0]
	found, err := spool.Find(in)
	if err != nil {
		return usage(fmt.Errorf("--input %v", err))
	}
	var tl *analyzer.Timeline
	if found.HasSpool() {
		tl, err = capture.Timeline(found.Capture, iv, 0)
	} else {
		var f trace.Input
		if f, err = spool.Open(in, trace.OpenOptions{}); err != nil {
			return usage(fmt.Errorf("--input %v", err))
		}
		tl, err = analyzer.BuildTimeline(f, iv)
		f.Close()
	}
	if err != nil {
		return fail(err)
	}
	peak, ok := tl.Peak()
	if !ok {
		return fail(fmt.Errorf("%s holds no events", in))
	}
	var rep analyzer.MemReport
	if found.HasSpool() {
		rep, err = capture.ReportWithTime(found.Capture, iv, peak.Ms)
	} else {
		var f trace.Input
		if f, err = spool.Open(in, trace.OpenOptions{}); err == nil {
			rep, err = tl.ReportAt(f, peak.Ms)
			f.Close()
		}
	}
	if err != nil {
		return fail(err)
	}
	analyzer.WriteTimeline(os.Stdout, tl, rep, peak.Ms)
	return 0
}
