package libmemscope

// The Go side of the C API's run control (include/msmemscope.h): options,
// begin, start, stop, where the capture is. capi/ exports these behind C
// shims that refuse in a forked child, so none runs in one. The Python
// package (python/msmemscope) calls the one copy of the library already
// mapped in the process, so there is one Go runtime and one capture per
// process image.

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "hook.h"
#include "pystack.h"
int msmemscope_start(void);
int msmemscope_stop(void);
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"msmemscope/collect"
	"msmemscope/config"
	"msmemscope/internal/logx"
	"msmemscope/internal/safefs"
	"msmemscope/spool"
)

var api struct {
	mu        sync.Mutex
	cfg       config.Config // the effective configuration, as config() left it
	started   bool          // start() was called at least once
	converted atomic.Bool   // stop() wrote the files and nothing was collected since
	stops     int
	warned    map[string]bool
	noExit    atomic.Bool // the program asked for no files at exit (SetExitFiles)
}

// loadConfig reads the configuration the API starts from (the CLI's, or
// the defaults); engine.go's init calls it before the capture may begin.
func loadConfig() {
	api.cfg = config.Default()
	if s := os.Getenv(config.EnvConfig); s != "" {
		if c, err := config.Decode(s); err == nil {
			api.cfg = c
		}
	}
	logx.SetLevel(api.cfg.LogLevel)
	if C.ms_interposed() != 0 && api.cfg.PyStackOn {
		enablePyStack(api.cfg.PyStack)
	}
}

// interposed reports whether this copy of the library was preloaded or
// linked (its allocator symbols are the program's).
func interposed() bool { return C.ms_interposed() != 0 }

// lazyBegin reports whether the capture waits for start(): the library was
// loaded by Python with dlopen instead of being preloaded, so nothing is
// interposed and collection is what the program asks for through the API.
// So is a process of a traced run whose preload was taken away (meant
// untraced) that loaded the library anyway, as NVTX does through
// NVTX_INJECTION64_PATH: no capture unless it asks.
func lazyBegin() bool {
	return !interposed() && (C.ms_py_present() != 0 || os.Getenv(config.EnvRunID) != "")
}

// exitConvertWanted reports whether the engine should write the files at
// exit in a standalone capture: not when stop() wrote them already and
// nothing was collected since. (Called with eng.mu held: no api.mu here.)
func exitConvertWanted() bool {
	return !api.converted.Load() && !api.noExit.Load()
}

// SetExitFiles says whether a standalone capture writes its files at exit
// (the default) or leaves its spool alone: a scratch capture read while it
// runs (the pytest plugin's) has no use for a dump.
func SetExitFiles(on bool) { api.noExit.Store(!on) }

func warnOnce(key, msg string) {
	if api.warned == nil {
		api.warned = map[string]bool{}
	}
	if api.warned[key] {
		return
	}
	api.warned[key] = true
	logx.Warnf("%s", msg)
}

func enablePyStack(depth int) {
	switch r := C.ms_py_enable(C.int(depth)); r {
	case -2, -3:
		which := "this Python"
		if v := uint64(C.ms_py_version()); v != 0 {
			which = fmt.Sprintf("Python %d.%d", v>>24, (v>>16)&0xff)
		}
		why := "no supported frame layout"
		if r == -3 {
			why = "a build with another object layout (free-threaded or debug)"
		}
		warnOnce("pyversion", which+": "+why+", so MALLOC rows carry no Python stack (CPython 3.10, 3.11, 3.12 and 3.13 are supported)")
	}
}

// pyError words a configuration error with Python's spelling of the option
// (call_stack, not --call-stack); the rule text is the CLI's.
func pyError(err error) string {
	if oe, ok := err.(*config.OptionError); ok {
		return strings.Replace(oe.Error(), "for --"+oe.Option+":", "for "+strings.ReplaceAll(oe.Option, "-", "_")+":", 1)
	}
	return err.Error()
}

// applyHook hands the parts of the configuration the hot path reads to it.
func applyHook(c *config.Config) {
	h := c.Hook()
	kernel := 0
	if h.Kernel {
		kernel = 1
	}
	C.ms_set_cuda(C.uint32_t(h.CUDA), C.int(kernel))
	if C.ms_interposed() != 0 {
		if h.Rotate {
			C.ms_set_rotating(1) // before heap events: no record needing its thread's past
		}
		heap := 0
		if h.Heap {
			heap = 1
		}
		C.ms_set_hook(C.int(heap), C.int(h.CStack))
		enablePyStack(h.PyStack)
	}
}

// recordConfig puts the effective configuration into the capture, so that
// whoever writes the files (stop(), the exit, the CLI) uses it.
func recordConfig(c *config.Config) {
	s := c.Encode()
	cs := C.CString(s)
	defer C.free(unsafe.Pointer(cs))
	C.ms_py_event(C.R_CONFIG, 0, cs, C.uint32_t(len(s)))
}

// Configure applies options given as a JSON array of [name, value] pairs,
// all or none: each is checked with the CLI's rules, then the whole. The
// error is one line, with Python's spelling of the option.
func Configure(items string) error {
	var pairs [][2]string
	if e := json.Unmarshal([]byte(items), &pairs); e != nil {
		return fmt.Errorf("bad configuration request: %v", e)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	c := api.cfg
	// Lists are copied so a failed request leaves the current value intact.
	c.Devices = append([]string(nil), c.Devices...)
	c.Analysis = append([]string(nil), c.Analysis...)
	c.Steps = append([]int(nil), c.Steps...)
	for _, p := range pairs {
		if e := c.Set(p[0], p[1]); e != nil {
			return errors.New(pyError(e))
		}
	}
	if e := c.Finish(); e != nil {
		return errors.New(pyError(e))
	}
	eng.mu.Lock()
	if eng.started && !eng.finished {
		// Only an output given now moves the capture: a relative one kept
		// from before would resolve elsewhere after a chdir.
		if given(pairs, "output") {
			if abs, err := config.AbsOutput(c.Output); err == nil && abs != eng.cfg.Output {
				moveCapture(abs)
			}
		}
		c.Output = eng.cfg.Output
	}
	eng.mu.Unlock()
	api.cfg = c
	logx.SetLevel(c.LogLevel)
	applyHook(&c)
	if c.CollectMode == "deferred" && !api.started {
		C.msmemscope_stop() // deferred: off until the first start()
	}
	recordConfig(&c)
	return nil
}

// given reports whether option name is among the [name, value] pairs.
func given(pairs [][2]string, name string) bool {
	for _, p := range pairs {
		if n, ok := config.CanonicalName(p[0]); ok && n == name {
			return true
		}
	}
	return false
}

// moveCapture moves the capture begun before config(output=...) into the
// new output folder, so that its files are written there (eng.mu held).
func moveCapture(output string) {
	eng.rotMu.Lock()
	defer eng.rotMu.Unlock()
	old, err := eng.proc.Move(output)
	if err != nil {
		warnOnce("output", fmt.Sprintf("output: the capture could not move to %s (%v): its files are written in %s", output, err, eng.proc.Dir))
		return
	}
	eng.cfg.Output = output
	if eng.rot != nil {
		eng.rot.Moved(filepath.Join(old, spool.SpoolDir), filepath.Join(eng.proc.Dir, spool.SpoolDir))
	}
	setCrashFile(eng.proc.Dir)
}

// beginLazy begins the capture if it waits for start() (api.mu held).
func beginLazy() error {
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if !eng.started && !eng.finished && lazyBegin() {
		if err := begin(api.cfg); err != nil {
			return err
		}
		recordConfig(&api.cfg)
	}
	return nil
}

// Begin begins the capture if it waits for start(), without switching
// collection on (the Python trace needs the folder).
func Begin() error {
	api.mu.Lock()
	defer api.mu.Unlock()
	return beginLazy()
}

// Start begins the capture if it waits for start(), then switches
// collection on.
func Start() error {
	api.mu.Lock()
	defer api.mu.Unlock()
	if e := beginLazy(); e != nil {
		return e
	}
	api.started = true
	api.converted.Store(false)
	C.msmemscope_start()
	return nil
}

// Stop switches collection off. Without a CLI it then writes the files of
// SPEC §2 from everything captured so far (new files each time) and returns
// the dump's path; "" when the CLI writes them.
func Stop() (string, error) {
	C.msmemscope_stop()
	api.mu.Lock()
	defer api.mu.Unlock()
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if !eng.started || eng.finished || !eng.proc.Standalone() {
		return "", nil
	}
	drainNow()
	api.stops++
	opt := collect.Options{Console: os.Stderr, MapsFile: snapshotMaps(eng.proc.Dir, api.stops)}
	res, e := collect.Convert(eng.proc.Dir, opt)
	if e != nil {
		return "", e
	}
	api.converted.Store(true)
	return res.DumpPath, nil
}

// drainNow writes what the rings hold so far to the capture (eng.mu held).
// With rotating logs the drain loop owns the rotator: it is stopped, the
// rest drained in order, and started again.
func drainNow() {
	if eng.rot == nil {
		C.ms_drain()
		return
	}
	stopDrain()
	drainRotateAll()
	eng.rotMu.Lock()
	if err := eng.rot.Flush(); err != nil {
		rotateFailed(err)
	}
	eng.rotMu.Unlock()
	startDrain()
}

// snapshotMaps copies the process's mappings now, for symbolizing C stacks
// of a capture that is still running.
func snapshotMaps(dir string, n int) string {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return ""
	}
	p, _ := safefs.CreateUnique(func(i int) string {
		return filepath.Join(dir, spool.SpoolDir, fmt.Sprintf("maps.stop%d.txt", n+i))
	}, func(p string) error {
		return safefs.WriteNew(p, func(w io.Writer) error { _, err := w.Write(b); return err })
	})
	return p
}

// Dir is the capture folder of this process, "" when no capture has begun.
func Dir() string {
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if eng.started {
		return eng.proc.Dir
	}
	return ""
}

// EffectiveConfig is the effective configuration, as JSON.
func EffectiveConfig() string {
	api.mu.Lock()
	defer api.mu.Unlock()
	return api.cfg.Encode()
}

// Standalone reports whether no CLI owns this capture.
func Standalone() bool {
	return os.Getenv(config.EnvRunID) == ""
}
