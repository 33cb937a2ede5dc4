package trace

import (
	"math"
	"math/rand"
	"strconv"
	"testing"
)

// The CSV writer's number formatting is strconv's, byte for byte.
func TestNumbersAsStrconv(t *testing.T) {
	vals := []uint64{0, 1, 9, 10, 99, 100, 999_999, 1_000_000, 1_000_001, 9_999_999, 10_000_000,
		1<<32 - 1, 1 << 32, 33815921309668, math.MaxInt64, 9_999_999_999_999_999_999, math.MaxUint64}
	for p := uint64(1); p < math.MaxUint64/10; p *= 10 {
		vals = append(vals, p-1, p, p+1)
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 100000; i++ {
		vals = append(vals, rng.Uint64()>>uint(rng.Intn(64)))
	}
	var run, stamp, ids decRun
	var ptrs, heap hexRun
	b := make([]byte, 0, 4) // small: the growing path too
	for _, v := range vals {
		check := func(name string, got []byte, want string) {
			t.Helper()
			if string(got) != want {
				t.Fatalf("%s(%d) = %q, want %q", name, v, got, want)
			}
		}
		check("appendUint", appendUint(b[:0], v), strconv.FormatUint(v, 10))
		check("appendHex", appendHex(b[:0], v), strconv.FormatUint(v, 16))
		check("appendInt", appendInt(b[:0], int64(v)), strconv.FormatInt(int64(v), 10))
		check("decRun", run.append([]byte("x"), v), "x"+strconv.FormatUint(v, 10))
		// a stamp-like run: the high digits repeat
		s := 33815921309668 + v%5_000_000
		check("decRun stamps", stamp.append(b[:0], s), strconv.FormatUint(s, 10))
		// allocation ids: a MALLOC's new id, then an older one freed
		check("decRun ids", ids.append(b[:0], v%3_000_000), strconv.FormatUint(v%3_000_000, 10))
		check("hexRun", ptrs.append([]byte("x"), v), "x"+strconv.FormatUint(v, 16))
		// a heap's addresses: the high digits repeat
		h := 0x55d0c2a00000 + v%(1<<20)
		check("hexRun heap", heap.append(b[:0], h), strconv.FormatUint(h, 16))
	}
}
