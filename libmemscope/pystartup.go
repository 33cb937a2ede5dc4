package libmemscope

/*
#include <dlfcn.h>
#include <stdlib.h>
#include "hook.h"
#include "pystack.h"
static int ms_py_flag(const char *name) {
	const int *p = dlsym(RTLD_DEFAULT, name);
	return p ? *p : 0;
}
*/
import "C"

import (
	"bytes"
	"os"

	"msmemscope/config"
	"unsafe"
)

// The CLI offers a traced Python program a startup hook (a sitecustomize on
// PYTHONPATH, python/msmemscope/_startup) that starts the PyTorch collection
// when the program imports torch. An interpreter run with -I, -E or -S never
// loads it; pyStartupSkipped says so at exit, in one line, when it mattered:
// the program loaded torch (system tools run with -Es say nothing). CPython
// keeps its legacy flag variables in step with its configuration (3.10 to
// 3.13).
func pyStartupSkipped() string {
	if os.Getenv(config.EnvPyStartup) == "" || C.ms_py_present() == 0 {
		return ""
	}
	if maps, err := os.ReadFile("/proc/self/maps"); err != nil || !bytes.Contains(maps, []byte("/libtorch_python.so")) {
		return ""
	}
	for _, f := range []struct{ name, opt string }{
		{"Py_IsolatedFlag", "-I"}, {"Py_IgnoreEnvironmentFlag", "-E"}, {"Py_NoSiteFlag", "-S"},
	} {
		cs := C.CString(f.name)
		on := C.ms_py_flag(cs) != 0
		C.free(unsafe.Pointer(cs))
		if on {
			return "Python ran with " + f.opt + ", so msmemscope's startup hook did not load: PyTorch operators and tensor blocks were collected only if the program called msmemscope.start()"
		}
	}
	return ""
}
