// Package watchhash calls libmemscope's msmemscope_hash64 (watchhash.c, the
// XXH64 that the tensor watch hashes blocks with) from Go, so that a test can
// check it against XXH64's reference values: cgo cannot live in a _test.go
// file. watchhash.c here is a symbolic link to libmemscope's.
package watchhash

/*
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
uint64_t msmemscope_hash64(const void *data, size_t len);
*/
import "C"

// Hash64 is msmemscope_hash64(b, len(b)); nil gives the C side a NULL.
func Hash64(b []byte) uint64 {
	if b == nil {
		return uint64(C.msmemscope_hash64(nil, 0))
	}
	p := C.CBytes(b)
	defer C.free(p)
	return uint64(C.msmemscope_hash64(p, C.size_t(len(b))))
}
