package watchhash

import (
	"strings"
	"testing"
)

// XXH64 with seed 0: the reference implementation's values.
func TestHash64(t *testing.T) {
	for in, want := range map[string]uint64{
		"":    0xef46db3751d8e999,
		"a":   0xd24ec4f1a98c6e5b,
		"abc": 0x44bc2cf5ad770999,
		"Nobody inspects the spammish repetition": 0xfbcea83c8a378bf1, // 39 bytes: the 32-byte lanes
	} {
		if got := Hash64([]byte(in)); got != want {
			t.Errorf("hash64(%q) = %#x, want %#x", in, got, want)
		}
	}
	if Hash64(nil) != 0 {
		t.Error("hash64(NULL) is not 0")
	}
	// Every tail length after the lanes, and a change in any byte, tell.
	s := []byte(strings.Repeat("0123456789abcdef", 5))
	seen := map[uint64]bool{}
	for n := 0; n <= len(s); n++ {
		h := Hash64(s[:n])
		if seen[h] {
			t.Errorf("hash64 of %d bytes repeats an earlier value", n)
		}
		seen[h] = true
	}
	for i := range s {
		b := append([]byte(nil), s...)
		b[i] ^= 1
		if Hash64(b) == Hash64(s) {
			t.Errorf("flipping byte %d does not change the hash", i)
		}
	}
}
