package libmemscope

// The C API the Python package binds to with ctypes (python/msmemscope). The
// package always calls the one copy of the library already mapped in the
// process, so there is one Go runtime and one capture per process image.
//
// Functions here enter Go: the Python side never calls them in a forked
// child (it checks its pid first); what a child may call (mstx, describe,
// msmemscope_start/stop/step) are C shims in hook.c and pystack.c.

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
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"msmemscope/capture"
	"msmemscope/collect"
	"msmemscope/config"
	"msmemscope/internal/safefs"
)

var api struct {
	mu        sync.Mutex
	cfg       config.Config // the effective configuration, as config() left it
	started   bool          // start() was called at least once
	converted atomic.Bool   // stop() wrote the files and nothing was collected since
	stops     int
	warned    map[string]bool
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
	if C.ms_interposed() != 0 && api.cfg.PyStackOn {
		enablePyStack(api.cfg.PyStack)
	}
}

// lazyBegin reports whether the capture waits for start(): the library was
// loaded by Python with dlopen instead of being preloaded, so nothing is
// interposed and collection is what the program asks for through the API.
func lazyBegin() bool {
	return C.ms_interposed() == 0 && C.ms_py_present() != 0
}

// exitConvertWanted reports whether the engine should write the files at
// exit in a standalone capture: not when stop() wrote them already and
// nothing was collected since. (Called with eng.mu held: no api.mu here.)
func exitConvertWanted() bool {
	return !api.converted.Load()
}

func warnOnce(key, msg string) {
	if api.warned == nil {
		api.warned = map[string]bool{}
	}
	if api.warned[key] {
		return
	}
	api.warned[key] = true
	fmt.Fprintf(os.Stderr, "msmemscope: warning: %s\n", msg)
}

func enablePyStack(depth int) {
	switch C.ms_py_enable(C.int(depth)) {
	case -2:
		which := "this Python (before 3.11)"
		if v := uint64(C.ms_py_version()); v != 0 {
			which = fmt.Sprintf("Python %d.%d", v>>24, (v>>16)&0xff)
		}
		warnOnce("pyversion", which+": no supported frame layout, so MALLOC rows carry no Python stack (CPython 3.11 is supported)")
	}
}

func putString(dst *C.char, n C.int, s string) {
	if dst == nil || n <= 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(dst)), int(n))
	k := copy(b[:len(b)-1], s)
	b[k] = 0
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
	if C.ms_interposed() != 0 {
		h := c.Hook()
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

// msmemscope_config applies options given as a JSON array of [name, value]
// pairs, all or none: each is checked with the CLI's rules, then the whole.
// Returns 0, or -1 with a one-line error in err.
//
//export msmemscope_config
func msmemscope_config(items *C.char, err *C.char, errlen C.int) C.int {
	var pairs [][2]string
	if e := json.Unmarshal([]byte(C.GoString(items)), &pairs); e != nil {
		putString(err, errlen, "bad configuration request: "+e.Error())
		return -1
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
			putString(err, errlen, pyError(e))
			return -1
		}
	}
	if e := c.Finish(); e != nil {
		putString(err, errlen, pyError(e))
		return -1
	}
	eng.mu.Lock()
	begun := eng.started
	var out string
	if begun {
		out = eng.cfg.Output
	}
	eng.mu.Unlock()
	if begun {
		abs, _ := config.AbsOutput(c.Output)
		if abs != out {
			warnOnce("output", fmt.Sprintf("output cannot change once the capture has begun (it is in %s)", out))
		}
		c.Output = out
	}
	api.cfg = c
	applyHook(&c)
	if c.CollectMode == "deferred" && !api.started {
		C.msmemscope_stop() // deferred: off until the first start()
	}
	recordConfig(&c)
	return 0
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

// msmemscope_py_begin begins the capture if it waits for start(), without
// switching collection on (the Python trace needs the folder). Returns 0,
// or -1 with the reason in err.
//
//export msmemscope_py_begin
func msmemscope_py_begin(err *C.char, errlen C.int) C.int {
	api.mu.Lock()
	defer api.mu.Unlock()
	if e := beginLazy(); e != nil {
		putString(err, errlen, e.Error())
		return -1
	}
	return 0
}

// msmemscope_py_start begins the capture if it waits for start(), then
// switches collection on. Returns 0, or -1 with the reason in err.
//
//export msmemscope_py_start
func msmemscope_py_start(err *C.char, errlen C.int) C.int {
	api.mu.Lock()
	defer api.mu.Unlock()
	if e := beginLazy(); e != nil {
		putString(err, errlen, e.Error())
		return -1
	}
	api.started = true
	api.converted.Store(false)
	C.msmemscope_start()
	return 0
}

// msmemscope_py_stop switches collection off. Without a CLI it then writes
// the files of SPEC §2 from everything captured so far (new files each time)
// and puts the dump's path in path. Returns 0, or -1 with the error in path.
//
//export msmemscope_py_stop
func msmemscope_py_stop(path *C.char, pathlen C.int) C.int {
	C.msmemscope_stop()
	api.mu.Lock()
	defer api.mu.Unlock()
	eng.mu.Lock()
	defer eng.mu.Unlock()
	putString(path, pathlen, "")
	if !eng.started || eng.finished || !eng.proc.Standalone() {
		return 0
	}
	drainNow()
	api.stops++
	opt := collect.Options{Console: os.Stderr, MapsFile: snapshotMaps(eng.proc.Dir, api.stops)}
	res, e := collect.Convert(eng.proc.Dir, opt)
	if e != nil {
		putString(path, pathlen, e.Error())
		return -1
	}
	api.converted.Store(true)
	putString(path, pathlen, res.DumpPath)
	return 0
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
	for drainRotate() {
	}
	startDrain()
}

// snapshotMaps copies the process's mappings now, for symbolizing C stacks
// of a capture that is still running.
func snapshotMaps(dir string, n int) string {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return ""
	}
	for i := n; i < n+1000; i++ {
		p := filepath.Join(dir, capture.SpoolDir, fmt.Sprintf("maps.stop%d.txt", i))
		err := safefs.WriteNew(p, func(w io.Writer) error { _, err := w.Write(b); return err })
		if err == nil {
			return p
		}
		if !os.IsExist(err) && !strings.Contains(err.Error(), "exists") {
			return ""
		}
	}
	return ""
}

// msmemscope_dir puts the capture folder of this process in buf ("" when no
// capture has begun). Returns its length.
//
//export msmemscope_dir
func msmemscope_dir(buf *C.char, n C.int) C.int {
	eng.mu.Lock()
	defer eng.mu.Unlock()
	d := ""
	if eng.started {
		d = eng.proc.Dir
	}
	putString(buf, n, d)
	return C.int(len(d))
}

// msmemscope_get_config puts the effective configuration (JSON) in buf.
// Returns its length (larger than n-1 when it did not fit).
//
//export msmemscope_get_config
func msmemscope_get_config(buf *C.char, n C.int) C.int {
	api.mu.Lock()
	s := api.cfg.Encode()
	api.mu.Unlock()
	putString(buf, n, s)
	return C.int(len(s))
}

// msmemscope_interposed reports whether this library interposes the
// allocator (preloaded or linked): host-heap events need it.
//
//export msmemscope_interposed
func msmemscope_interposed() C.int { return C.ms_interposed() }

// msmemscope_standalone reports whether no CLI owns this capture.
//
//export msmemscope_standalone
func msmemscope_standalone() C.int {
	if os.Getenv(config.EnvRunID) != "" {
		return 0
	}
	return 1
}
