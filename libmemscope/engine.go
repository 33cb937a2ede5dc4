// Package libmemscope is the collector inside the traced process: the C hot
// path (hooks.c) records into per-thread rings, and this Go engine owns the
// capture folder, drains the rings into the spool every millisecond, and
// finishes the capture at exit.
package libmemscope

/*
#cgo CFLAGS: -O2 -g -fno-plt -fno-omit-frame-pointer -Wall -Wno-unused-function
#cgo LDFLAGS: -ldl -lpthread
#include "hook.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"msmemscope/capture"
	"msmemscope/config"
	"msmemscope/spool"
)

// engine is the one capture of this process image.
var eng struct {
	mu         sync.Mutex
	started    bool
	finished   bool
	cfg        config.Config
	proc       *capture.Process
	rot        *capture.Rotator // --log-mode=rotate
	rotMu      sync.Mutex
	buf        []byte
	stop, done chan struct{}
	cdrain     bool // the spool's drain is drain.c's thread
	// convertLate: a standalone capture's files are written after the
	// leak-kind scan, which runs after every destructor (exitscan.go).
	convertLate bool
	// endLate: end.json (the capture is whole) is written after the
	// leak kinds, so that no one converts it before they are there.
	endLate bool
	// gcPercent: the GC percent before logs began to rotate.
	gcPercent int
}

// The library's one init: the API's configuration is read first (api.go),
// then the capture of a preloaded process begins (it may take that
// configuration). One function, so that the order does not hang on file
// names. Nothing runs in a forked child: its parent's Go runtime is not
// there.
func init() {
	if C.msmemscope_in_child() != 0 {
		return
	}
	loadConfig()
	autoBegin()
	C.ms_engine_settled() // a crash handler waits for the capture until now (crash.c)
}

// autoBegin starts the capture of a preloaded process.
func autoBegin() {
	if lazyBegin() {
		return // loaded by Python with dlopen: the capture begins at start() (api.go)
	}
	if err := start(); err != nil {
		fmt.Fprintf(os.Stderr, "msmemscope: %v (nothing is recorded in this process)\n", err)
	}
}

func start() error {
	cfg := config.Default()
	if s := os.Getenv(config.EnvConfig); s != "" {
		c, err := config.Decode(s)
		if err != nil {
			return err
		}
		cfg = c
	}
	return begin(cfg)
}

// begin creates the capture folder and starts draining into its spool.
func begin(cfg config.Config) error {
	out, err := config.AbsOutput(cfg.Output)
	if err != nil {
		return err
	}
	cfg.Output = out
	p, err := capture.Begin(cfg, int(C.ms_pid()), os.Getenv(config.EnvRunID))
	if err != nil {
		return err
	}
	if cfg.LogMode == "rotate" {
		rot, err := capture.NewRotator(filepath.Join(p.Dir, spool.SpoolDir), int(C.ms_pid()), cfg.LogFiles, cfg.LogFileMB)
		if err != nil {
			return err
		}
		rot.OnWritten = sinkDone
		// The program's RSS should grow by 64 MB at most: the drain's
		// buffers and encoders hold ~20 MB, which the GC would let double.
		// A lower GC percent follows the live heap (a soft memory limit
		// would make the GC run back to back once the rotator's live set
		// outgrew it).
		eng.gcPercent = debug.SetGCPercent(rotateGCPercent)
		eng.rot, eng.buf = rot, make([]byte, rot.BatchMax())
		C.ms_set_rotating(1) // each log is read on its own (format/records.def)
	}
	eng.cfg, eng.proc, eng.started = cfg, p, true
	setCrashFile(p.Dir)
	C.ms_set_spool(C.int(p.SpoolFD()))
	C.ms_calibrate()
	startDrain()
	startLiveFollower(filepath.Join(p.Dir, spool.SpoolDir, spool.FileName))
	return nil
}

// setCrashFile tells the crash handler where the capture in dir records a crash.
func setCrashFile(dir string) {
	mark := []byte(filepath.Join(dir, spool.SpoolDir, spool.CrashFile))
	C.ms_set_crash_file((*C.char)(unsafe.Pointer(&mark[0])), C.int(len(mark)))
}

// startDrain starts moving ring contents out every millisecond, so a run
// killed with SIGKILL loses at most the last few milliseconds. Each pass also
// starts a new timestamp epoch with a clock calibration point (drain.c). The
// spool is drained by a C thread (drain.c says why); rotating logs, which Go
// compresses, by a goroutine, as is the spool if the thread cannot start.
func startDrain() {
	eng.cdrain = eng.rot == nil && C.ms_drainer_start() == 0
	if eng.cdrain {
		return
	}
	eng.stop, eng.done = make(chan struct{}), make(chan struct{})
	go drainLoop()
}

// stopDrain stops the periodic drain; what is still in the rings stays there.
func stopDrain() {
	if eng.cdrain {
		C.ms_drainer_stop()
		return
	}
	close(eng.stop)
	<-eng.done
}

// drainLoop is the goroutine's drain: at once again while the rotating
// logs' passes find drainAgainEvents records or more, else after 1 ms, up
// to 8 ms for an idle process.
func drainLoop() {
	defer close(eng.done)
	idle := 0
	for {
		select {
		case <-eng.stop:
			return
		default:
		}
		var moved bool // whether the pass moved events (else: 1, 2, 4, 8 ms)
		if eng.rot != nil {
			// Again at once while the rings fill faster than a pass
			// takes them: a program recording flat out waits for room.
			events, full := drainRotate()
			if full && events > 0 || events >= drainAgainEvents {
				idle = 0
				continue
			}
			moved = events > 0 // (calibrations and marks are not)
		} else {
			moved = int(C.ms_drain()) > idleBytes // (a failure is counted in C)
		}
		if moved {
			idle = 0
		} else if idle < 3 {
			idle++
		}
		time.Sleep(time.Millisecond << idle)
	}
}

// idleBytes is what a pass that found no events writes: its calibration
// (a record and the old epoch's end, drain.c's epoch_start).
const idleBytes = spool.ChunkHdrSize + spool.RecSize + spool.UnitSize

// drainAgainEvents: a rotating logs' pass that found this many records
// (about half a millisecond of the drain's work), or filled its buffer with
// any, is followed by the next at once: a program recording flat out waits
// for room in its ring.
const drainAgainEvents = 16384

// drainRotate moves ring contents into the rotating logs; it reports the
// records moved (Rotator.BatchEvents) and whether the buffer filled up.
func drainRotate() (int, bool) {
	eng.rotMu.Lock() // the drain loop and get_mem_report both drain
	defer eng.rotMu.Unlock()
	// Until the batch is in the log, a crash handler waits (crash.c): its
	// events have left the rings. Each drain counts one batch there, which
	// the rotator's goroutine uncounts once its frames are written.
	n := C.ms_drain_into(unsafe.Pointer(&eng.buf[0]), C.long(len(eng.buf)))
	if n <= 0 {
		C.ms_sink_done()
		if n < 0 {
			eng.proc.NoteDrainErrors(1)
		}
		return 0, false
	}
	full := C.ms_drain_into_more() != 0 // more is waiting in the rings
	if err := eng.rot.Write(eng.buf[:n]); err != nil {
		rotateFailed(err)
	}
	return eng.rot.BatchEvents(), full
}

// drainRotateAll drains the rings into the rotating logs until they are
// empty (or a pass moves nothing but its calibration).
func drainRotateAll() {
	for {
		if events, full := drainRotate(); !full || events == 0 {
			return
		}
	}
}

// rotateFailed counts a batch the logs could not take and says so, once, as
// drain.c says it of the spool (a full disk: else the capture ends short
// without a word).
func rotateFailed(err error) {
	eng.proc.NoteDrainErrors(1)
	rotateWarn.Do(func() {
		fmt.Fprintf(os.Stderr, "msmemscope: process %d: writing the rotated logs failed (%v): events are being lost, and the capture will end short\n", os.Getpid(), err)
	})
}

var rotateWarn sync.Once

// rotateGCPercent is the GC's percent while logs rotate.
const rotateGCPercent = 50

// sinkDone is the rotator's OnWritten: a batch is in its log.
func sinkDone() { C.ms_sink_done() }

// msGoEnter does nothing. A C thread's first call into Go binds it to a Go
// thread record and sets its signal mask (Go unblocks the signals it needs,
// its preemption signal among them); the exit's work blocks them after
// this call, so that the later calls keep its mask (crash.c,
// exit_work_begin).
//
//export msGoEnter
func msGoEnter() {}

//export msGoAtExit
func msGoAtExit() {
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if !eng.started || eng.finished {
		return
	}
	eng.finished = true
	if w := pyStartupSkipped(); w != "" {
		warnOnce("pystartup", w)
	}
	stopDrain()
	if eng.rot != nil {
		// The final drain goes to the logs too: only they know each
		// thread's past, which a pending pair half needs (format/records.def).
		C.ms_finish_begin()
		drainRotateAll()
		if err := eng.rot.Close(); err != nil { // (the last batch's write)
			rotateFailed(err)
		}
		debug.SetGCPercent(eng.gcPercent) // the analyses at exit as any conversion
		eng.proc.NoteRotator(eng.rot)
		C.ms_drain() // what raced with the above: late events, in full
	} else {
		C.ms_finish()
	}
	if C.ms_late_armed() != 0 {
		eng.endLate = true // end.json after the leak kinds (exitscan.go)
	} else {
		endCapture()
	}
	if eng.proc.Standalone() && exitConvertWanted() {
		// No CLI will convert this capture: write the files now. Frees in
		// destructors that run after this one reach the spool only.
		if C.ms_late_armed() != 0 {
			eng.convertLate = true // after the leak-kind scan (exitscan.go)
		} else {
			convertAtExit()
		}
	}
}

// endCapture writes end.json, with every failed drain pass counted: the C
// drain's (its thread's and the final drain's) and the rotator's.
func endCapture() {
	eng.proc.NoteDrainErrors(uint64(C.ms_drain_errors()))
	eng.proc.End(uint64(C.ms_lost()), uint64(C.ms_forks()))
}
