// Package reply is the one shape of what every data-returning call of the C
// API hands back (include/msmemscope.h): a JSON document
//
//	{"ok": true, "result": ..., "text": "console report"}
//	{"ok": false, "type": "ValueError", "error": "one line"}
//
// "text" is there only when the call printed a report (an analysis); "type"
// names the Python exception the error becomes.
package reply

import (
	"encoding/json"
	"fmt"
)

type ok struct {
	OK     bool   `json:"ok"`
	Result any    `json:"result"`
	Text   string `json:"text,omitempty"`
}

type failed struct {
	OK    bool   `json:"ok"`
	Type  string `json:"type"`
	Error string `json:"error"`
}

// Kind names the Python exception an error becomes.
type Kind func(error) string

// Always is the Kind that names one exception for every error.
func Always(name string) Kind { return func(error) string { return name } }

// Encode is the reply for a call's outcome: v and text when err is nil,
// else err as the exception kind names.
func Encode(v any, text string, err error, kind Kind) []byte {
	if err != nil {
		return encodeError(kind(err), err.Error())
	}
	b, e := json.Marshal(ok{OK: true, Result: v, Text: text})
	if e != nil {
		return encodeError("RuntimeError", "cannot encode the result: "+e.Error())
	}
	return b
}

// Run calls f and encodes its outcome. A panic becomes a RuntimeError
// reply: a bug must not take the user's process down.
func Run(kind Kind, f func() (v any, text string, err error)) (b []byte) {
	defer func() {
		if p := recover(); p != nil {
			b = encodeError("RuntimeError", fmt.Sprintf("msmemscope internal error: %v", p))
		}
	}()
	v, text, err := f()
	return Encode(v, text, err, kind)
}

func encodeError(kind, msg string) []byte {
	b, _ := json.Marshal(failed{Type: kind, Error: msg})
	return b
}
