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
	"msmemscope/spool"
)

// Measurement windows (msmemscope_window_begin / _end): what the process
// allocated between two calls — the peak of those blocks' live bytes, and
// those still live at the end — by allocation site. The pytest plugin
// measures each test with one. The spool is read as it grows (liveSites),
// so each window costs a drain and the events recorded since the last
// call, never a replay of the capture; the hot path does no extra work.
// Only blocks allocated inside the window count: a FREE of an older block
// changes nothing.

var win struct {
	mu   sync.Mutex
	tail *spool.Tail
	on   bool
	s    *liveSites // while a window is open
}

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
// held). The window's state changes only while it is on.
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
	if !win.on {
		return win.tail.Read(func(*spool.Rec) {})
	}
	return win.s.catchUp()
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
	win.on = false
	if err := windowCatchUp(); err != nil {
		return err
	}
	win.on = true
	win.s = newLiveSites(win.tail, hostMemory)
	return nil
}

// WindowEnd ends the window and reports it, with the top sites of each
// list (top <= 0: every site).
func WindowEnd(top int) (WindowReport, error) {
	win.mu.Lock()
	defer win.mu.Unlock()
	if !win.on {
		return WindowReport{}, errors.New("no measurement window is open: call msmemscope_window_begin first")
	}
	err := windowCatchUp()
	win.on = false
	if err != nil {
		return WindowReport{}, err
	}
	w := win.s
	win.s = nil
	if w.dirty {
		w.snapshot()
	}
	names := newSiteNamer(win.tail)
	rep := WindowReport{PeakBytes: w.peak, LeakedBytes: w.live, LeakedBlocks: w.liveBlocks(),
		AllocatedBytes: w.allocated, Allocations: w.nalloc}
	rep.PeakSites = names.report(w.peakAt, top)
	rep.LeakSites = names.report(w.sites, top)
	return rep, nil
}
