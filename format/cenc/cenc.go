// Package cenc calls the C record encoders (libmemscope/records.h) from Go,
// so that a test can decode what the hook writes with the Go decoder, field
// by field. It exists for that test: cgo cannot live in a _test.go file.
//
// records.h and records_gen.h here are symbolic links to libmemscope's: the
// go command hashes the headers in a package's own folder only, so an edit
// of the encoders rebuilds this package (and reruns the test) through them.
package cenc

/*
#cgo CFLAGS: -O2 -Wall
#include <stdlib.h>
#include "records.h"

// cgo calls these; records.h's functions are always_inline.
static uint32_t c_full(uint64_t *w, uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site, const void *p, uint32_t plen) {
	return enc_full(w, kind, flags, ts, a, b, site, p, plen);
}
static uint32_t c_full_units(uint32_t plen) { return enc_full_units(plen); }
static uint64_t c_tag(uint16_t flags) { return enc_tag(flags); }
static uint32_t c_malloc(uint64_t *w, uint64_t tag, uint64_t ptr, uint64_t size, uint32_t site) { return enc_malloc(w, tag, ptr, size, site); }
static uint32_t c_malloc_id(uint64_t *w, uint64_t tag, uint64_t ptr, uint64_t size, uint32_t site, uint64_t id) { return enc_malloc_id(w, tag, ptr, size, site, id); }
static uint32_t c_free(uint64_t *w, uint64_t tag, uint64_t ptr) { return enc_free(w, tag, ptr); }
static int c_short_fits(uint64_t ptr, uint64_t size) { return ENC_SHORT_FITS(ptr, size); }
static uint32_t c_short(uint64_t *w, uint64_t ptr, uint64_t size, int off) { return enc_short(w, ptr, size, off); }
static int c_half_malloc_fits(uint64_t d, uint64_t size) { return ENC_HALF_MALLOC_FITS(d, size); }
static uint32_t c_half_malloc(uint64_t d, uint64_t size) { return enc_half_malloc(d, size); }
static int c_half_free_fits(uint64_t d) { return ENC_HALF_FREE_FITS(d); }
static uint32_t c_half_free(uint64_t d) { return enc_half_free(d); }
static void c_pair_first(uint64_t *w, uint32_t h) { enc_pair_first(w, h); }
static void c_pair_second(uint64_t *w, uint32_t h) { enc_pair_second(w, h); }
static uint32_t c_stamp(uint64_t *w, uint64_t ts) { return enc_stamp(w, ts); }
static uint32_t c_stamped_half(uint64_t *w, uint64_t delta, uint32_t h) { return enc_stamped_half(w, delta, h); }
static uint32_t c_units(const uint64_t *u) { return rec_units(u); }
static void c_chunk(void *p, uint32_t magic, uint32_t nunit, int32_t tid, const void *units) { enc_chunk(p, magic, nunit, tid, units); }
static void c_pad(void *p, size_t len) { enc_pad(p, len); }
static uint32_t c_crc(int32_t tid, const void *p, size_t n, int soft) { return soft ? crc32c_soft(tid, p, n) : chunk_crc(tid, p, n); }
static uint64_t c_pystack_head(uint32_t nc, uint32_t npy) { return enc_pystack_head(nc, npy); }
static uint64_t c_pyframe(uint32_t code, int32_t lasti) { return enc_pyframe(code, lasti); }
static void c_pycode_head(void *p, uint32_t id, int32_t fl, int32_t ft, uint16_t f, uint16_t n, uint16_t q, uint16_t ltf,
                          uint32_t lt) {
	enc_pycode_head(p, id, fl, ft, f, n, q, ltf, lt);
}
*/
import "C"

import (
	"encoding/binary"
	"unsafe"
)

// CSide is a few constants as records_gen.h has them, for the test.
var CSide = struct{ ChunkMagic, PadMagic, RecUnits, PyCodeSize, MaxPayload int }{
	C.MS_CHUNK_MAGIC, C.MS_PAD_MAGIC, C.REC_UNITS, C.sizeof_ms_pycode, C.REC_MAX_PAYLOAD}

// units returns the first n units of w as little-endian bytes.
func units(w []C.uint64_t, n C.uint32_t) []byte {
	out := make([]byte, 8*int(n))
	for i := 0; i < int(n); i++ {
		binary.LittleEndian.PutUint64(out[8*i:], uint64(w[i]))
	}
	return out
}

func ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// Full encodes a full record with its payload (site: a MALLOC's site id).
func Full(kind, flags uint16, ts, a, b uint64, site uint32, payload []byte) []byte {
	w := make([]C.uint64_t, C.c_full_units(C.uint32_t(len(payload))))
	cp := C.CBytes(payload)
	defer C.free(cp)
	n := C.c_full(&w[0], C.uint16_t(kind), C.uint16_t(flags), C.uint64_t(ts), C.uint64_t(a), C.uint64_t(b), C.uint32_t(site), cp, C.uint32_t(len(payload)))
	return units(w, n)
}

// Tag is a compact record's first unit above its address.
func Tag(flags uint16) uint64 { return uint64(C.c_tag(C.uint16_t(flags))) }

// Malloc encodes a compact MALLOC (2 units).
func Malloc(flags uint16, p, size uint64, site uint32) []byte {
	var w [3]C.uint64_t
	n := C.c_malloc(&w[0], C.c_tag(C.uint16_t(flags)), C.uint64_t(p), C.uint64_t(size), C.uint32_t(site))
	return units(w[:], n)
}

// MallocID encodes a compact MALLOC naming an R_STACK by id (3 units).
func MallocID(flags uint16, p, size uint64, site uint32, id uint64) []byte {
	var w [3]C.uint64_t
	n := C.c_malloc_id(&w[0], C.c_tag(C.uint16_t(flags)), C.uint64_t(p), C.uint64_t(size), C.uint32_t(site), C.uint64_t(id))
	return units(w[:], n)
}

// Free encodes a compact FREE (1 unit).
func Free(flags uint16, p uint64) []byte {
	var w [1]C.uint64_t
	n := C.c_free(&w[0], C.c_tag(C.uint16_t(flags)), C.uint64_t(p))
	return units(w[:], n)
}

// ShortFits says whether a MALLOC has the short form.
func ShortFits(p, size uint64) bool { return C.c_short_fits(C.uint64_t(p), C.uint64_t(size)) != 0 }

// Short encodes a short MALLOC (1 unit); off: recorded with F_OFF.
func Short(p, size uint64, off bool) []byte {
	var w [1]C.uint64_t
	o := C.int(0)
	if off {
		o = 1
	}
	n := C.c_short(&w[0], C.uint64_t(p), C.uint64_t(size), o)
	return units(w[:], n)
}

// HalfMallocFits says whether a MALLOC of size at last+d has a pair half.
func HalfMallocFits(d, size uint64) bool {
	return C.c_half_malloc_fits(C.uint64_t(d), C.uint64_t(size)) != 0
}

// HalfMalloc is a MALLOC's pair half (d: its address minus the last).
func HalfMalloc(d, size uint64) uint32 {
	return uint32(C.c_half_malloc(C.uint64_t(d), C.uint64_t(size)))
}

// HalfFreeFits says whether a FREE at last+d has a pair half.
func HalfFreeFits(d uint64) bool { return C.c_half_free_fits(C.uint64_t(d)) != 0 }

// HalfFree is a FREE's pair half.
func HalfFree(d uint64) uint32 { return uint32(C.c_half_free(C.uint64_t(d))) }

// Pair encodes a pair unit holding first alone, or first and second.
func Pair(first uint32, second *uint32) []byte {
	var w [1]C.uint64_t
	C.c_pair_first(&w[0], C.uint32_t(first))
	if second != nil {
		C.c_pair_second(&w[0], C.uint32_t(*second))
	}
	return units(w[:], 1)
}

// Stamp encodes a stamp unit.
func Stamp(ts uint64) []byte {
	var w [1]C.uint64_t
	return units(w[:], C.c_stamp(&w[0], C.uint64_t(ts)))
}

// StampedHalf encodes the pair half h stamped delta after the thread's last stamp.
func StampedHalf(delta uint64, h uint32) []byte {
	var w [1]C.uint64_t
	return units(w[:], C.c_stamped_half(&w[0], C.uint64_t(delta), C.uint32_t(h)))
}

// Units is what the drain takes the event at the start of b to span, in units.
func Units(b []byte) int {
	w := make([]C.uint64_t, len(b)/8)
	for i := range w {
		w[i] = C.uint64_t(binary.LittleEndian.Uint64(b[8*i:]))
	}
	return int(C.c_units(&w[0]))
}

// Chunk encodes a chunk header for units (nunit of them; nil: none).
func Chunk(magic, nunit uint32, tid int32, units []byte) []byte {
	b := make([]byte, C.sizeof_ms_chunk)
	var u unsafe.Pointer
	if len(units) > 0 {
		u = ptr(units)
	}
	C.c_chunk(ptr(b), C.uint32_t(magic), C.uint32_t(nunit), C.int32_t(tid), u)
	return b
}

// CRC is the drain's checksum of a chunk of thread tid's whole units: the CPU's way, or (soft) bit
// by bit, as where the CPU has no crc32 instruction.
func CRC(tid int32, units []byte, soft bool) uint32 {
	s := 0
	if soft {
		s = 1
	}
	return uint32(C.c_crc(C.int32_t(tid), ptr(units), C.size_t(len(units)/8), C.int(s)))
}

// Pad encodes a padding chunk of n bytes (at least a chunk header).
func Pad(n int) []byte {
	b := make([]byte, n)
	C.c_pad(ptr(b), C.size_t(n))
	return b
}

// PyStackHead is the first payload unit of a MALLOC with F_PYSTACK.
func PyStackHead(nc, npy uint32) uint64 {
	return uint64(C.c_pystack_head(C.uint32_t(nc), C.uint32_t(npy)))
}

// PyFrame is a Python frame of such a payload.
func PyFrame(code uint32, lasti int32) uint64 {
	return uint64(C.c_pyframe(C.uint32_t(code), C.int32_t(lasti)))
}

// PyCodeHead encodes the ms_pycode header of an R_PYCODE payload.
func PyCodeHead(id uint32, firstLine, firstTraceable int32, fileLen, nameLen, qualLen, ltFormat uint16, lineTableLen uint32) []byte {
	b := make([]byte, C.sizeof_ms_pycode)
	C.c_pycode_head(ptr(b), C.uint32_t(id), C.int32_t(firstLine), C.int32_t(firstTraceable), C.uint16_t(fileLen),
		C.uint16_t(nameLen), C.uint16_t(qualLen), C.uint16_t(ltFormat), C.uint32_t(lineTableLen))
	return b
}
