package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/capture"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/trace"
)

// openTimelineInput opens --input for --timeline: a capture folder (its spool),
// an output folder holding exactly one capture, or a dump CSV file. It can be
// called twice: the report at the peak replays the stream.
func openTimelineInput(in string) (func() (trace.Stream, func() error, error), error) {
	fi, err := os.Stat(in)
	if err != nil {
		return nil, fmt.Errorf("--input %s: %v", in, err)
	}
	if !fi.IsDir() {
		if !strings.HasSuffix(in, ".csv") {
			return nil, fmt.Errorf("--input %s: expected a capture folder or a memscope_dump CSV file", in)
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
		}, nil
	}
	dir := in
	if _, err := capture.ReadMeta(dir); err != nil {
		var found []string
		ents, _ := os.ReadDir(in)
		for _, e := range ents {
			d := filepath.Join(in, e.Name())
			if _, err := capture.ReadMeta(d); e.IsDir() && err == nil {
				found = append(found, d)
			}
		}
		if len(found) != 1 {
			return nil, fmt.Errorf("--input %s: holds %d captures; name one msmemscope_{pid}_{timestamp} folder", in, len(found))
		}
		dir = found[0]
	}
	return func() (trace.Stream, func() error, error) { return capture.OpenStream(dir) }, nil
}

// timeline prints the peak timeline of a capture and the per-site report at
// its peak (SPEC §7).
func timeline(inv *cli.Invocation) int {
	open, err := openTimelineInput(inv.Inputs[0])
	if err != nil {
		return usage(err)
	}
	s, closeFn, err := open()
	if err != nil {
		return usage(err)
	}
	tl, err := analyzer.BuildTimeline(s, uint64(inv.IntervalMs))
	closeFn()
	if err != nil {
		return fail(err)
	}
	peak, ok := tl.Peak()
	if !ok {
		return fail(fmt.Errorf("%s holds no events", inv.Inputs[0]))
	}
	s, closeFn, err = open()
	if err != nil {
		return fail(err)
	}
	rep, err := tl.ReportAt(s, peak.Ms)
	closeFn()
	if err != nil {
		return fail(err)
	}
	analyzer.WriteTimeline(os.Stdout, tl, rep, peak.Ms)
	return 0
}
