package main

import (
	"fmt"
	"os"

	"msmemscope/analyzer"
	"msmemscope/capture"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/trace"
)

// openTimelineInput resolves --input for --timeline: a capture folder (its
// spool or rotating logs; returned as dir), an output folder holding exactly
// one capture, or a dump file, CSV or DB (opened by the returned function,
// which can be called twice: the report at the peak replays the stream).
func openTimelineInput(in string) (func() (trace.Stream, func() error, error), string, error) {
	fi, err := os.Stat(in)
	if err != nil {
		return nil, "", fmt.Errorf("--input %s: %v", in, err)
	}
	if !fi.IsDir() {
		f, err := trace.Open(in, trace.OpenOptions{Lean: true})
		if err != nil {
			return nil, "", fmt.Errorf("--input %s: expected a capture folder or a memscope_dump CSV or DB file: %v", in, err)
		}
		f.Close()
		return func() (trace.Stream, func() error, error) {
			f, err := trace.Open(in, trace.OpenOptions{})
			if err != nil {
				return nil, nil, err
			}
			return f, f.Close, nil
		}, "", nil
	}
	dir, err := capture.Resolve(in)
	if err != nil {
		return nil, "", fmt.Errorf("--input %v", err)
	}
	return func() (trace.Stream, func() error, error) { return capture.OpenStream(dir) }, dir, nil
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
