// 64-bit content hash of a memory block (XXH64, seed 0) for the watch of
// SPEC §5.4: python/msmemscope/torch_hooks.py hashes watched tensors' blocks
// after every launch through msmemscope_hash64.
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#define P1 11400714785074694791ULL
#define P2 14029467366897019727ULL
#define P3 1609587929392839161ULL
#define P4 9650029242287828579ULL
#define P5 2870177450012600261ULL

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t round1(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
static inline uint64_t merge(uint64_t acc, uint64_t v) { return (acc ^ round1(0, v)) * P1 + P4; }

uint64_t msmemscope_hash64(const void *data, size_t len) {
	const uint8_t *p = data, *end = p + len;
	uint64_t h;
	if (!data) return 0;
	if (len >= 32) {
		uint64_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = -P1;
		const uint8_t *lim = end - 32;
		do {
			v1 = round1(v1, rd64(p));
			v2 = round1(v2, rd64(p + 8));
			v3 = round1(v3, rd64(p + 16));
			v4 = round1(v4, rd64(p + 24));
			p += 32;
		} while (p <= lim);
		h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
		h = merge(h, v1);
		h = merge(h, v2);
		h = merge(h, v3);
		h = merge(h, v4);
	} else {
		h = P5;
	}
	h += (uint64_t)len;
	for (; p + 8 <= end; p += 8) h = rotl(h ^ round1(0, rd64(p)), 27) * P1 + P4;
	if (p + 4 <= end) {
		h = rotl(h ^ (uint64_t)rd32(p) * P1, 23) * P2 + P3;
		p += 4;
	}
	for (; p < end; p++) h = rotl(h ^ (*p * P5), 11) * P1;
	h ^= h >> 33;
	h *= P2;
	h ^= h >> 29;
	h *= P3;
	h ^= h >> 32;
	return h;
}
