// Command capi is the c-shared build of libmemscope.so: the collector
// (libmemscope) and the exported C API of include/msmemscope.h. Build with
//
//	go build -buildmode=c-shared -o libmemscope.so ./capi
//
// Every call of the API that needs Go is a C shim (shims.c) that refuses in
// a forked child before Go is entered — a child of a multi-threaded Go
// process must never run Go code — and keeps the calling thread's
// allocations out of the capture; it then calls the Go export here, which
// returns the one reply shape (package reply) in memory from malloc. The
// calls that need no Go (start, stop, step, mstx, describe) are C in
// libmemscope.
package main

/*
#cgo CFLAGS: -O2 -Wall -I${SRCDIR}/../include -I${SRCDIR}/../libmemscope
#include <stddef.h>
char *capi_reply(const char *json, size_t n);
*/
import "C"

import (
	"fmt"
	"unsafe"

	"msmemscope/capi/reply"
)

func main() {}

// out hands a reply to C: a NUL-terminated copy from malloc, NULL when out
// of memory.
func out(b []byte) *C.char {
	return C.capi_reply((*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b)))
}

// call runs f and hands its reply to C.
func call(kind reply.Kind, f func() (any, error)) *C.char {
	return out(reply.Run(kind, func() (any, string, error) {
		v, err := f()
		return v, "", err
	}))
}

var (
	valueError   = reply.Always("ValueError")
	runtimeError = reply.Always("RuntimeError")
)

// nullable is s, or JSON null when s is "".
func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// runError words a run-control error as msmemscope's own.
func runError(err error) error {
	if err != nil {
		return fmt.Errorf("msmemscope: %w", err)
	}
	return nil
}
