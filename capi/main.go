// Command capi is the c-shared build of libmemscope.so: the collector and the
// exported C API (include/msmemscope.h). Build with
//
//	go build -buildmode=c-shared -o libmemscope.so ./capi
package main

import _ "msmemscope/libmemscope"

func main() {}
