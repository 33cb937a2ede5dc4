package main

import (
	"fmt"
	"os"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/capture"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/spool"
	"msmemscope/trace"
)

// openTimelineInput resolves --input for --timeline: a capture folder (its
// spool or rotating logs; returned as dir), an output folder holding exactly
// one capture, or a dump CSV file (opened by the returned function, which can
// be called twice: the report at the peak replays the stream).
func openTimelineInput(in string) (func() (trace.Stream, func() error, error), string, error) {
	fi, err := os.Stat(in)
	if err != nil {
		return nil, "", fmt.Errorf("--input %s: %v", in, err)
	}
	if !fi.IsDir() {
		if !strings.HasSuffix(in, ".csv") {
			return nil, "", fmt.Errorf("--input %s: expected a capture folder or a memscope_dump CSV file", in)
		}
		return func() (trace.Stream, func() error, error) {
			f, err := os.Open(in)
			if err != nil {
				return nil, nil, err
			}
			r, err := trace.NewCSVReader(f, in)
			if err != nil {
				f.Close()
				return nil, nil, err
			}
			return r, f.Close, nil
		}, "", nil
	}
	dir, err := spool.FindCapture(in)
	if err != nil {
		return nil, "", fmt.Errorf("--input %v", err)
	}
	return func() (trace.Stream, func() error, error) { return spool.OpenStream(dir) }, dir, nil
}

// timeline prints the peak timeline of a capture and the per-site report at
// its peak (SPEC §7). Rotating logs are parsed in parallel.
func timeline(inv *cli.Invocation) int {
	iv := uint64(inv.IntervalMs)
	open, dir, err := openTimelineInput(inv.Inputs[0])
	if err != nil {
		return usage(err)
	}
	var tl *analyzer.Timeline
	if dir != "" {
		tl, err = capture.Timeline(dir, iv, 0)
	} else {
		var s trace.Stream
		var closeFn func() error
		if s, closeFn, err = open(); err == nil {
			tl, err = analyzer.BuildTimeline(s, iv)
			closeFn()
		}
	}
	if err != nil {
		return fail(err)
	}
	peak, ok := tl.Peak()
	if !ok {
		return fail(fmt.Errorf("%s holds no events", inv.Inputs[0]))
	}
	var rep analyzer.MemReport
	if dir != "" {
		rep, err = capture.ReportWithTime(dir, iv, peak.Ms)
	} else {
		var s trace.Stream
		var closeFn func() error
		if s, closeFn, err = open(); err == nil {
			rep, err = tl.ReportAt(s, peak.Ms)
			closeFn()
		}
	}
	if err != nil {
		return fail(err)
	}
	analyzer.WriteTimeline(os.Stdout, tl, rep, peak.Ms)
	return 0
}
