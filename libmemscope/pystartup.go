package libmemscope

/*
#include "hook.h"
#include "pystack.h"
*/
import "C"

import (
	"bytes"
	"os"

	"msmemscope/config"
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
	for i, opt := range []string{"-I", "-E", "-S"} { // ms_py_flag's order
		if C.ms_py_flag(C.int(i)) != 0 {
			return "Python ran with " + opt + ", so msmemscope's startup hook did not load: PyTorch operators and tensor blocks were collected only if the program called msmemscope.start()"
		}
	}
	return ""
}
