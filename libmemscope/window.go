package libmemscope

/*
#include "pystack.h"
*/
import "C"

import (
	"errors"
	"path/filepath"
	"sync"

	"msmemscope/format"
	"msmemscope/livesites"
	"msmemscope/spool"
)

// Measurement windows (msmemscope_window_begin / _end): what the process
// allocated between two calls — the peak of those blocks' live bytes, and
// those still live at the end — by allocation site. The pytest plugin
// measures each test with one. The spool is read as it grows (livesites),
// so each window costs a drain and the events recorded since the last
// call, never a replay of the capture; the hot path does no extra work.
// Only blocks allocated inside the window count: a FREE of an older block
// changes nothing.

var win struct {
	mu   sync.Mutex
	tail *spool.Tail
	s    *livesites.Set // while a window is open
}

// WindowSite is one line of a window's report.
type WindowSite = livesites.Site

// WindowReport is msmemscope_window_end's result.
type WindowReport struct {
	PeakBytes      uint64       `json:"peak_bytes"`      // the highest live bytes of blocks allocated in the window
	LeakedBytes    uint64       `json:"leaked_bytes"`    // bytes allocated in the window and live at its end
	LeakedBlocks   int          `json:"leaked_blocks"`   // blocks of those
	AllocatedBytes uint64       `json:"allocated_bytes"` // every allocation in the window, freed or not
	Allocations    int          `json:"allocations"`
	PeakSites      []WindowSite `json:"peak_sites"` // live bytes per site at the peak, largest first
	LeakSites      []WindowSite `json:"leak_sites"` // live bytes per site at the end, largest first
}

// windowCatchUp drains the rings and reads the spool up to now (win.mu
// held). The window's state changes only while one is open.
func windowCatchUp() error {
	eng.mu.Lock()
	ok := eng.started && !eng.finished
	var dir string
	if ok {
		if eng.rot != nil {
			eng.mu.Unlock()
			return errors.New("measurement windows need log_mode=full (rotating logs cannot be read as they grow)")
		}
		dir = eng.proc.Dir
		drainNow()
	}
	eng.mu.Unlock()
	if !ok {
		return errors.New("no capture is running in this process")
	}
	if win.tail == nil {
		t, err := spool.OpenTail(filepath.Join(dir, spool.SpoolDir, spool.FileName))
		if err != nil {
			return err
		}
		win.tail = t
	}
	if win.s == nil {
		return win.tail.Read(func(*spool.Rec) {})
	}
	return win.s.CatchUp()
}

// hostMemory: a window keeps the host heap and anonymous mappings (a GPU's
// cache would read as every test's peak and leak).
func hostMemory(sub uint16) bool { return sub == format.FHost || sub == format.FMmap }

// WindowBegin starts a measurement window: from now on, blocks allocated
// are followed until WindowEnd.
func WindowBegin() error {
	win.mu.Lock()
	defer win.mu.Unlock()
	if C.ms_interposed() == 0 {
		return errors.New("measurement windows need libmemscope.so preloaded (the host heap is not interposed)")
	}
	win.s = nil
	if err := windowCatchUp(); err != nil {
		return err
	}
	win.s = livesites.New(win.tail, hostMemory, true)
	return nil
}

// WindowEnd ends the window and reports it, with the top sites of each
// list (top <= 0: every site).
func WindowEnd(top int) (WindowReport, error) {
	win.mu.Lock()
	defer win.mu.Unlock()
	if win.s == nil {
		return WindowReport{}, errors.New("no measurement window is open: call msmemscope_window_begin first")
	}
	err := windowCatchUp()
	w := win.s
	win.s = nil
	if err != nil {
		return WindowReport{}, err
	}
	tot := w.Totals()
	rep := WindowReport{PeakBytes: tot.Peak, LeakedBytes: tot.Live, LeakedBlocks: w.Blocks(),
		AllocatedBytes: tot.Allocated, Allocations: tot.Allocations}
	rep.PeakSites, rep.LeakSites = w.Named(top)
	return rep, nil
}
