// The record encoders: pure functions that write an event's units into a
// buffer (a thread's ring, a direct write's buffer, a test's array). Every
// writer of records uses these, the hot path included (they inline to what
// it wrote by hand), and format/cenc calls them to test the Go decoder
// (spool/spool.go) against them. The layout itself, and every constant, is
// format/records.def's (records_gen.h).
#ifndef MEMSCOPE_RECORDS_H
#define MEMSCOPE_RECORDS_H

#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "records_gen.h"

#define ENC static inline __attribute__((always_inline))

// ---- full records: ms_rec, then n payload units ----
#define REC_MAX_PAYLOAD (REC_N_MASK * 8) // bytes: n holds 16 bits of units

// Units a full record with plen payload bytes takes.
ENC uint32_t enc_full_units(uint32_t plen) { return REC_UNITS + (plen + 7) / 8; }

// A full record at w: its header, then the payload with its last unit
// zero-padded; site goes into the upper half of n (a MALLOC's site id).
// Returns the units written. plen <= REC_MAX_PAYLOAD.
ENC uint32_t enc_full(uint64_t *w, uint16_t kind, uint16_t flags, uint64_t ts, uint64_t a, uint64_t b, uint32_t site,
                      const void *payload, uint32_t plen) {
	uint32_t n = (plen + 7) / 8;
	ms_rec h = {n | site << 16, flags, kind, ts, a, b};
	memcpy(w, &h, sizeof h);
	if (n) {
		w[REC_UNITS + n - 1] = 0;
		memcpy(&w[REC_UNITS], payload, plen);
	}
	return REC_UNITS + n;
}

// ---- compact records: no stamp (the thread's epoch), see records.def ----
// A compact record's first unit above its address: C_COMPACT and its flags.
ENC uint64_t enc_tag(uint16_t flags) { return C_COMPACT | (uint64_t)flags << 48; }

// MALLOC in 2 units (tag: enc_tag(flags)); returns the units written.
ENC uint32_t enc_malloc(uint64_t *w, uint64_t tag, uint64_t ptr, uint64_t size, uint32_t site) {
	w[0] = ptr | tag;
	w[1] = size | (uint64_t)site << 48;
	return 2;
}

// MALLOC whose C stack is an R_STACK's id: 3 units (tag has F_CSTACK | F_STACKID).
ENC uint32_t enc_malloc_id(uint64_t *w, uint64_t tag, uint64_t ptr, uint64_t size, uint32_t site, uint64_t id) {
	enc_malloc(w, tag, ptr, size, site);
	w[2] = id;
	return 3;
}

// FREE in 1 unit.
ENC uint32_t enc_free(uint64_t *w, uint64_t tag, uint64_t ptr) {
	w[0] = ptr | tag | C_FREE;
	return 1;
}

// Whether a MALLOC has a short form (F_HOST, at its thread's last site).
// The *_FITS tests are macros: likely() around an inline function's result
// loses its hint, and the hot path's layout with it.
#define ENC_SHORT_FITS(ptr, size) ((size) < C_SHORT_SIZE && !((ptr) & ~((1ull << 47) - 16)))

// A short MALLOC in 1 unit; off: it has F_OFF.
ENC uint32_t enc_short(uint64_t *w, uint64_t ptr, uint64_t size, int off) {
	w[0] = C_COMPACT | C_SHORT | (off ? C_SHORT_OFF : 0) | size << C_SHORT_SHIFT | ptr >> 4;
	return 1;
}

// ---- pair units: two halves, each relative to the last compact address ----
// d (uint64_t) is ptr minus that address.
#define ENC_HALF_MALLOC_FITS(d, size) ((size) < P_MSIZE && !(((d) + P_MNEAR) & ~(2 * P_MNEAR - 16)))
ENC uint32_t enc_half_malloc(uint64_t d, uint64_t size) {
	return P_MALLOC | (uint32_t)size << P_MSHIFT | (uint32_t)(d >> 4 & (P_MNEAR / 8 - 1));
}
#define ENC_HALF_FREE_FITS(d) (!(((d) + P_FNEAR) & ~(2 * P_FNEAR - 16)))
ENC uint32_t enc_half_free(uint64_t d) { return (uint32_t)(d >> 4 & (P_FNEAR / 8 - 1)); }

// The unit with its first half h (the second empty: the unit may go as it is).
ENC void enc_pair_first(uint64_t *w, uint32_t h) { w[0] = C_PAIR | (uint64_t)h << 32; }
// Adds the second half h to the pair unit at w.
ENC void enc_pair_second(uint64_t *w, uint32_t h) {
	((uint32_t *)w)[0] = h | P_SECOND; // little-endian: the unit's low half
}

// A stamp unit: the precise stamp of the thread's next event (ts <= P_STAMP_MAX).
ENC uint32_t enc_stamp(uint64_t *w, uint64_t ts) {
	w[0] = C_PAIR | P_STAMP | (ts & (P_STAMP - 1)) | (ts >> 30 & ((1ull << 29) - 1)) << 32;
	return 1;
}

// A stamped half: the pair half h whose stamp is delta after the thread's
// last stamp (delta <= P_STAMP_DMAX).
ENC uint32_t enc_stamped_half(uint64_t *w, uint64_t delta, uint32_t h) {
	w[0] = C_PAIR | P_STAMP | P_STAMPED | (uint64_t)h << 32 | delta;
	return 1;
}

// Units the event starting at u spans (a pair unit: 1).
ENC uint32_t rec_units(const uint64_t *u) {
	if (u[0] & C_COMPACT) return (u[0] & (C_FREE | C_SHORT)) ? 1 : (u[0] >> 48 & F_STACKID) ? 3 : 2;
	return REC_UNITS + (uint32_t)(u[0] & REC_N_MASK); // a full record: n is the low half of unit 0
}

// ---- chunks ----
// A chunk's checksum: CRC-32C (Castagnoli, as Go's hash/crc32 and iSCSI)
// of its thread id (4 bytes, little-endian) and its n units, so that a
// reader tells a chunk damaged on disk from a whole one (spool/spool.go).
// SSE 4.2's crc32 instruction where the CPU has it (one serial chain, ~3 GB/s
// on this project's VM), else bit by bit.
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static inline uint32_t crc32c_hw(int32_t tid, const uint64_t *u, size_t n) {
	uint32_t c = __builtin_ia32_crc32si(~0u, (uint32_t)tid);
	for (size_t i = 0; i < n; i++) {
		uint64_t w;
		memcpy(&w, &u[i], 8);
		c = (uint32_t)__builtin_ia32_crc32di(c, w);
	}
	return ~c;
}
#endif
static inline uint32_t crc32c_bytes(uint32_t c, const unsigned char *b, size_t n) {
	for (size_t i = 0; i < n; i++) {
		c ^= b[i];
		for (int k = 0; k < 8; k++) c = c >> 1 ^ (0x82F63B78u & (0u - (c & 1)));
	}
	return c;
}
static inline uint32_t crc32c_soft(int32_t tid, const void *p, size_t n) {
	unsigned char t[4] = {(unsigned char)tid, (unsigned char)(tid >> 8), (unsigned char)(tid >> 16), (unsigned char)(tid >> 24)};
	return ~crc32c_bytes(crc32c_bytes(~0u, t, 4), (const unsigned char *)p, n * 8);
}
static inline uint32_t chunk_crc(int32_t tid, const void *p, size_t n) {
#if defined(__x86_64__)
	static int hw = -1; // (CPUID.1:ECX bit 20, read once)
	if (hw < 0) {
		unsigned a, bx, cx = 0, d;
		hw = __get_cpuid(1, &a, &bx, &cx, &d) && (cx & bit_SSE4_2);
	}
	if (hw) return crc32c_hw(tid, (const uint64_t *)p, n);
#endif
	return crc32c_soft(tid, p, n);
}

// A chunk header at p for the nunit units at units (NULL: none).
ENC void enc_chunk(void *p, uint32_t magic, uint32_t nunit, int32_t tid, const void *units) {
	ms_chunk h = {magic, nunit, tid, units && nunit ? chunk_crc(tid, units, nunit) : 0};
	memcpy(p, &h, sizeof h);
}

// A padding chunk of len bytes (>= its header) at p: readers skip it.
ENC void enc_pad(void *p, size_t len) {
	enc_chunk(p, MS_PAD_MAGIC, (uint32_t)((len - sizeof(ms_chunk)) / 8), 0, NULL);
}

// ---- Python payloads (pystack.h) ----
// A MALLOC with F_PYSTACK: this unit, n_c return addresses, n_py frames.
ENC uint64_t enc_pystack_head(uint32_t nc, uint32_t npy) { return (uint64_t)nc | (uint64_t)npy << 32; }
// A frame: the code id and its instruction index (-1: not started).
ENC uint64_t enc_pyframe(uint32_t code, int32_t lasti) { return (uint64_t)code | (uint64_t)(uint32_t)lasti << 32; }

// The ms_pycode header at p of an R_PYCODE payload (the texts follow it).
ENC void enc_pycode_head(void *p, uint32_t id, int32_t firstline, int32_t firsttraceable, uint16_t file_len,
                         uint16_t name_len, uint16_t qualname_len, uint16_t lt_format, uint32_t linetable_len) {
	ms_pycode h = {id, firstline, firsttraceable, file_len, name_len, qualname_len, lt_format, linetable_len};
	memcpy(p, &h, sizeof h);
}

#endif
