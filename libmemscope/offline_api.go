package libmemscope

// The offline API of SPEC §6 for the Python package (msmemscope.offline):
// list_analyzers, get_analyzer_config and analyze, run by the Go analyses
// over CSV or SQLite dumps. Each function takes C strings and returns a
// JSON document in memory from malloc, which the caller gives back with
// msmemscope_free_string:
//
//	{"ok": true, "result": ..., "text": "console report"}
//	{"ok": false, "type": "ValueError", "error": "one line"}
//
// "type" names the Python exception to raise. These functions enter Go: the
// Python side never calls them in a forked child.

/*
#include <stdlib.h>
*/
import "C"

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unsafe"

	"msmemscope/analyzer"
)

type offlineReply struct {
	OK     bool   `json:"ok"`
	Result any    `json:"result,omitempty"`
	Text   string `json:"text,omitempty"`
	Type   string `json:"type,omitempty"`
	Error  string `json:"error,omitempty"`
}

func replyC(r offlineReply) *C.char {
	b, err := json.Marshal(r)
	if err != nil {
		b, _ = json.Marshal(offlineReply{Type: "RuntimeError", Error: "cannot encode the result: " + err.Error()})
	}
	return C.CString(string(b))
}

func replyErr(err error) *C.char {
	return replyC(offlineReply{Type: analyzer.ErrorKind(err), Error: err.Error()})
}

// offlineCall runs f, turning a panic into an error reply: a bug must not
// take the user's Python process down.
func offlineCall(f func() *C.char) (out *C.char) {
	defer func() {
		if p := recover(); p != nil {
			out = replyC(offlineReply{Type: "RuntimeError", Error: fmt.Sprintf("msmemscope internal error: %v", p)})
		}
	}()
	return f()
}

// msmemscope_list_analyzers returns {"ok": true, "result": ["leaks", ...]}.
//
//export msmemscope_list_analyzers
func msmemscope_list_analyzers() *C.char {
	return offlineCall(func() *C.char {
		return replyC(offlineReply{OK: true, Result: analyzer.ListAnalyzers()})
	})
}

// msmemscope_analyzer_config returns an analyzer's parameters: {name:
// {"type", "required", "default", "description"}}, plus "order", the
// parameter names in order.
//
//export msmemscope_analyzer_config
func msmemscope_analyzer_config(name *C.char) *C.char {
	return offlineCall(func() *C.char {
		n := C.GoString(name)
		cfg, err := analyzer.AnalyzerConfig(n)
		if err != nil {
			return replyErr(err)
		}
		order, _ := analyzer.AnalyzerParams(n)
		return replyC(offlineReply{OK: true, Result: map[string]any{"params": cfg, "order": order}})
	})
}

// msmemscope_analyze runs analyzer name with kwargs, a JSON object of
// keyword arguments.
//
//export msmemscope_analyze
func msmemscope_analyze(name *C.char, kwargs *C.char) *C.char {
	return offlineCall(func() *C.char {
		var args map[string]any
		d := json.NewDecoder(bytes.NewReader([]byte(C.GoString(kwargs))))
		d.UseNumber()
		if err := d.Decode(&args); err != nil {
			return replyErr(&analyzer.ArgError{Kind: "TypeError", Msg: "keyword arguments must be a JSON object: " + err.Error()})
		}
		n := C.GoString(name)
		res, err := analyzer.RunAnalyzer(n, args, analyzer.NewProgress(analyzer.Label(n)))
		if err != nil {
			return replyErr(err)
		}
		return replyC(offlineReply{OK: true, Result: res.Value, Text: res.Text})
	})
}

// msmemscope_free_string frees a string returned by the functions above.
//
//export msmemscope_free_string
func msmemscope_free_string(p *C.char) {
	C.free(unsafe.Pointer(p))
}
