package main

// The Go side of each C shim of shims.c: arguments in, one reply out (see
// main.go). The kind passed to call names the Python exception an error
// becomes: the offline analyses name their own (analyzer.ErrorKind).

/*
#include <stddef.h>
*/
import "C"

import (
	"encoding/json"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/capi/reply"
	"msmemscope/libmemscope"
)

//export msgo_config
func msgo_config(items *C.char) *C.char {
	s := C.GoString(items)
	return call(valueError, func() (any, error) { return nil, libmemscope.Configure(s) })
}

//export msgo_get_config
func msgo_get_config() *C.char {
	return call(runtimeError, func() (any, error) { return json.RawMessage(libmemscope.EffectiveConfig()), nil })
}

//export msgo_py_begin
func msgo_py_begin() *C.char {
	return call(runtimeError, func() (any, error) { return nil, runError(libmemscope.Begin()) })
}

//export msgo_py_start
func msgo_py_start() *C.char {
	return call(runtimeError, func() (any, error) { return nil, runError(libmemscope.Start()) })
}

//export msgo_py_stop
func msgo_py_stop() *C.char {
	return call(runtimeError, func() (any, error) {
		p, err := libmemscope.Stop()
		return nullable(p), runError(err)
	})
}

//export msgo_dir
func msgo_dir() *C.char {
	return call(runtimeError, func() (any, error) { return nullable(libmemscope.Dir()), nil })
}

//export msgo_standalone
func msgo_standalone() C.int {
	if libmemscope.Standalone() {
		return 1
	}
	return 0
}

//export msgo_get_mem_report
func msgo_get_mem_report() *C.char {
	return call(valueError, func() (any, error) { return libmemscope.MemReport() })
}

//export msgo_get_all_time_size
func msgo_get_all_time_size(input *C.char, intervalMs C.int) *C.char {
	in := C.GoString(input)
	return call(analyzer.ErrorKind, func() (any, error) { return libmemscope.AllTimeSize(in, int(intervalMs)) })
}

//export msgo_get_mem_report_with_time
func msgo_get_mem_report_with_time(input *C.char, tMs C.longlong, intervalMs C.int) *C.char {
	in := C.GoString(input)
	return call(analyzer.ErrorKind, func() (any, error) { return libmemscope.ReportWithTime(in, int64(tMs), int(intervalMs)) })
}

//export msgo_list_analyzers
func msgo_list_analyzers() *C.char {
	return call(analyzer.ErrorKind, func() (any, error) { return libmemscope.ListAnalyzers(), nil })
}

//export msgo_analyzer_config
func msgo_analyzer_config(name *C.char) *C.char {
	n := C.GoString(name)
	return call(analyzer.ErrorKind, func() (any, error) { return libmemscope.AnalyzerConfig(n) })
}

//export msgo_analyze
func msgo_analyze(name, kwargs *C.char) *C.char {
	n, k := C.GoString(name), C.GoString(kwargs)
	return out(reply.Run(analyzer.ErrorKind, func() (any, string, error) {
		res, err := libmemscope.Analyze(n, k)
		if err != nil {
			return nil, "", err
		}
		return res.Value, res.Text, nil
	}))
}

//export msgo_export
func msgo_export(input, formats, output *C.char) *C.char {
	in, fs, o := C.GoString(input), C.GoString(formats), C.GoString(output)
	return out(reply.Run(analyzer.ErrorKind, func() (any, string, error) {
		var list []string
		if fs != "" {
			list = strings.Split(fs, ",")
		}
		return libmemscope.Export(in, list, o) // (text: what a file lacks)
	}))
}

//export msgo_window_begin
func msgo_window_begin() *C.char {
	return call(runtimeError, func() (any, error) { return nil, libmemscope.WindowBegin() })
}

//export msgo_window_end
func msgo_window_end(top C.int) *C.char {
	return call(runtimeError, func() (any, error) { return libmemscope.WindowEnd(int(top)) })
}

//export msgo_exit_files
func msgo_exit_files(on C.int) {
	libmemscope.SetExitFiles(on != 0)
}
