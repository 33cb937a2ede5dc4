package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"msmemscope/analyzer"
	"msmemscope/cmd/msmemscope/cli"
	"msmemscope/collect"
	"msmemscope/config"
	"msmemscope/export"
	"msmemscope/internal/logx"
	"msmemscope/internal/safefs"
	"msmemscope/spool"
	"msmemscope/symbolize"
)

// ensureOutput creates the output folder and proves it writable before the
// program starts, so a bad --output fails at once with a one-line error.
func ensureOutput(dir string) error {
	if err := safefs.EnsureDir(dir); err != nil {
		return fmt.Errorf("--output %s: %v", dir, err)
	}
	f, err := os.CreateTemp(dir, ".msmemscope-probe-*")
	if err != nil {
		return fmt.Errorf("--output %s: folder is not writable: %v", dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// waitForStragglers gives processes of the run that outlived the main one
// (daemons, orphans) a moment to end before their spools are read.
func waitForStragglers(dirs []string, metas []*spool.ProcessMeta) {
	deadline := time.Now().Add(3 * time.Second)
	for i, d := range dirs {
		for time.Now().Before(deadline) {
			if _, err := os.Stat(filepath.Join(d, spool.SpoolDir, spool.EndFile)); err == nil {
				break
			}
			if syscall.Kill(metas[i].Pid, 0) != nil {
				break // gone (killed): convert what it left
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// collectRun converts every capture of the run and writes the manifest; sig
// is the signal that killed the main program, 0 if it exited.
func collectRun(cfg config.Config, runID string, mainPid int, command []string, code int, sig syscall.Signal) (*spool.Manifest, string, error) {
	dirs, metas := spool.RunFolders(cfg.Output, runID)
	notes, _ := filepath.Glob(spool.MovedNotes(cfg.Output, runID)) // followed: no longer needed
	for _, n := range notes {
		os.Remove(n)
	}
	waitForStragglers(dirs, metas)
	defer symbolize.KeepModules()() // the run's processes share libc and more
	traced := map[int]bool{}
	lastMain := -1
	for i, m := range metas {
		traced[m.Pid] = true
		if m.Pid == mainPid {
			lastMain = i
		}
	}
	man := &spool.Manifest{RunID: runID, Command: command, MainPid: mainPid, ExitStatus: code}
	firstMain := true
	var reports []*export.ProcReport
	for i, d := range dirs {
		m := metas[i]
		mp := spool.ManifestProcess{Pid: m.Pid, Ppid: m.Ppid, Cmdline: m.Cmdline, Folder: d}
		if m.Pid == mainPid && firstMain {
			mp.Main, firstMain = true, false
		}
		if i == lastMain {
			c := code
			mp.ExitStatus = &c
		}
		var console io.Writer
		if i == lastMain {
			console = os.Stderr
		}
		res, err := collect.Convert(d, collect.Options{Console: console, TracedChildren: traced, KeepLogs: cfg.LogMode == "rotate"})
		if err != nil {
			mp.Error = err.Error()
			fmt.Fprintf(os.Stderr, "msmemscope: %v\n", err)
		} else {
			if res.DumpPath == "" && res.Unwritten[spool.NotWrittenInLogs] > 0 {
				fmt.Fprintf(os.Stderr, "msmemscope: process %d: %d rows kept in its rotating logs, no dump written (msmemscope --input=%s writes it)\n",
					m.Pid, res.Unwritten[spool.NotWrittenInLogs], d)
			}
			mp.Events, mp.Rows, mp.Lost = res.Events, res.Rows, res.Lost
			reports = append(reports, res.Reports...)
			mp.Complete, mp.Ended, mp.Exec, mp.ForkedUntraced, mp.Dump = res.Complete, res.Ended, res.Exec, res.Untraced, res.DumpPath
			// Other images (a program run by a shell or a launcher) say
			// theirs when they leaked: step leaks, or blocks definitely lost.
			if i != lastMain && res.Leaks != nil && (len(res.Leaks.StepLeaks) > 0 || res.Leaks.ByKind[analyzer.LeakKinds[0]].Blocks > 0) {
				fmt.Fprintf(os.Stderr, "msmemscope: process %d (%s): %s", m.Pid, m.ProgName(), res.Leaks.Summary(3))
			}
			if w := collect.OrderWarning(res); w != "" {
				logx.Warnf("process %d: %s", m.Pid, w)
			}
		}
		man.Processes = append(man.Processes, mp)
	}
	if len(dirs) == 0 && sig != 0 && spool.CrashSignal(sig) {
		return nil, "", fmt.Errorf("no capture in %s: the program crashed with signal %d (%v) and left none (the capture is created as msmemscope's collector starts, and a crash before waits for it for 3 s)", cfg.Output, int(sig), sig)
	}
	if len(dirs) == 0 && sig != 0 {
		// The collector starts a few ms after main: a program dying at once
		// leaves nothing, and says so rather than suggesting a static binary.
		return nil, "", fmt.Errorf("no capture in %s: the program was killed by signal %d (%v) before msmemscope's collector had started in it", cfg.Output, int(sig), sig)
	}
	if len(dirs) == 0 {
		return nil, "", fmt.Errorf("no traced process left a capture in %s (was the program statically linked, or did it clear LD_PRELOAD?)", cfg.Output)
	}
	// The manifest goes where the main program's files are: a program
	// that called config(output=...) moved its capture there.
	manDir := cfg.Output
	for _, p := range man.Processes {
		if p.Main {
			manDir = filepath.Dir(p.Folder)
		}
	}
	runReport(manDir, reports)
	b, _ := json.MarshalIndent(man, "", "  ")
	path, err := safefs.CreateUnique(safefs.Stamped(filepath.Join(manDir, spool.ManifestPrefix), ".json", time.Now()),
		func(p string) error {
			return safefs.WriteNew(p, func(w io.Writer) error { _, err := w.Write(append(b, '\n')); return err })
		})
	if err != nil {
		return nil, "", err
	}
	return man, path, nil
}

// offline converts existing captures (--input=DIR): one process folder, or
// every process folder inside an output folder.
func offline(inv *cli.Invocation) int {
	in := inv.Inputs[0]
	fi, err := os.Stat(in)
	if err != nil {
		return usage(fmt.Errorf("--input %s: %v", in, err))
	}
	if !fi.IsDir() && !fi.Mode().IsRegular() { // (a FIFO would block the first read)
		return usage(fmt.Errorf("--input %s: not a regular file", in))
	}
	if inv.Set["output"] {
		// Checked as a collection run checks it, before anything is read
		// (a symbolic link, a folder others may write, a file).
		if err := ensureOutput(inv.Config.Output); err != nil {
			return usage(err)
		}
	}
	// A damaged capture named (the folder, its spool folder or a file in
	// that, or an output folder holding no other) is an error; one beside
	// others in an output folder is left out, said.
	found, ferr := spool.Find(in)
	if errors.Is(ferr, spool.ErrDamaged) {
		fmt.Fprintf(os.Stderr, "msmemscope: --input %v\n", ferr)
		return 2
	}
	if fi.IsDir() {
		for _, err := range spool.DamagedIn(in) {
			logx.Warnf("--input: left out: %v", err)
		}
	}
	// An output folder is converted whole, every process of every run in
	// it: spool.Find names only its main process, which --timeline wants.
	if ferr == nil && found.Capture != "" && !found.Output && (fi.IsDir() || filepath.Base(in) == spool.FileName) {
		in = found.Capture // a capture's spool/ folder or its spool file: the capture (a rotated log is read alone)
	} else if !fi.IsDir() {
		return offlineFile(inv, in) // a dump file: analyses (and --data-format) on it
	}
	dirs := []string{in}
	if !spool.IsCapture(in) {
		dirs = spool.Captures(in) // an output folder: every capture in it
	}
	if len(dirs) == 0 {
		if dumps := spool.DumpFiles(in); len(dumps) > 0 {
			return offlineFile(inv, dumps[len(dumps)-1]) // a capture without its spool
		}
		return usage(fmt.Errorf("--input %s: no capture found (no spool/process.json)", in))
	}
	rc := 0
	defer symbolize.KeepModules()() // the run's processes share libc and more
	var reports []*export.ProcReport
	defer func() { runReport(in, reports) }()
	for _, d := range dirs {
		opt := collect.Options{Console: os.Stderr}
		if inv.Set["analysis"] || inv.Set["steps"] || inv.Set["data-format"] || inv.Set["export"] {
			m, err := spool.ReadMeta(d)
			if err != nil {
				return fail(err)
			}
			c := m.Config
			if inv.Set["analysis"] {
				c.Analysis = inv.Config.Analysis
			}
			if inv.Set["steps"] {
				c.Steps = inv.Config.Steps
			}
			if inv.Set["data-format"] {
				c.DataFormat = inv.Config.DataFormat
			}
			if inv.Set["export"] {
				c.Export = inv.Config.Export
			}
			opt.Config = &c
		}
		res, err := collect.Convert(d, opt)
		if err == nil {
			reports = append(reports, res.Reports...)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "msmemscope: %v\n", err)
			code := 1
			if collect.IsInputError(err) {
				code = 2 // the capture is cut short or damaged
			}
			rc = max(rc, code)
			continue
		}
		state := "complete"
		switch {
		case res.Crash != nil && !res.Complete && res.Ended == spool.EndedSignal:
			state = fmt.Sprintf("incomplete: the process was ended by signal %d; every event recorded before it is in", res.Crash.Signal)
		case res.Crash != nil && !res.Complete:
			state = fmt.Sprintf("incomplete: the process crashed with signal %d; every event recorded before the crash is in", res.Crash.Signal)
		case res.DrainErrors > 0:
			state = "incomplete: writes to the spool failed during the run"
		case !res.Complete:
			state = "incomplete: the process did not end normally"
		}
		fmt.Fprintf(os.Stderr, "msmemscope: %s: %d rows (%s) -> %s\n", d, res.Rows, state, res.DumpPath)
	}
	return rc
}

// runReport writes the HTML report of a run of several processes (each
// process's own is in its capture's export folder) into dir's export
// folder: a summary across them, then each one.
func runReport(dir string, reports []*export.ProcReport) {
	if len(reports) < 2 {
		return
	}
	p, err := export.RunReport(filepath.Join(dir, export.Dir), safefs.Stamp(time.Now()), reports, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "msmemscope: the run's report: %v\n", err)
		return
	}
	fmt.Fprintf(os.Stderr, "msmemscope: report of the run's %d processes written to %s\n", len(reports), p)
}
