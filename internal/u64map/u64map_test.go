package u64map

import (
	"math/rand"
	"testing"
)

type val struct {
	id, size uint64
	tid      int32
}

// The map agrees with a Go map under random puts, takes and looks, with
// keys that collide (close addresses, key 0), through growing and emptying.
func TestAsGoMap(t *testing.T) {
	for _, runs := range []bool{false, true} {
		for _, grain := range []uint{0, 4} {
			testAsGoMap(t, runs, grain)
		}
	}
}

// Keys that share their low bits (strides of 64 and of pages) in a map of
// Runs take no longer to find than others: their offsets within runs are
// spread too.
func TestRunsStrided(t *testing.T) {
	for _, stride := range []uint64{1, 64, 4096 * 16} {
		m := Map[int]{Runs: true}
		for i := uint64(1); i <= 100000; i++ {
			m.Put(i*stride, 1)
		}
		probes := 0
		for i := uint64(1); i <= 100000; i++ {
			k := i * stride
			for j := m.home(k); m.slots[j].key != k; j = (j + 1) & (len(m.slots) - 1) {
				probes++
			}
		}
		if avg := float64(probes) / 100000; avg > 2 {
			t.Errorf("stride %d: %.1f extra probes a key", stride, avg)
		}
	}
}

func testAsGoMap(t *testing.T, runs bool, grain uint) {
	rng := rand.New(rand.NewSource(7))
	m := Map[val]{Runs: runs, Grain: grain}
	ref := map[uint64]val{}
	keys := []uint64{0}
	for i := 0; i < 4000; i++ {
		keys = append(keys, uint64(1+rng.Intn(2))<<60|0x5500_0000_0000+uint64(rng.Intn(6000))*16)
		keys = append(keys, uint64(i+1), uint64(i)*1024) // runs of ids; a stride
	}
	for op := 0; op < 400000; op++ {
		k := keys[rng.Intn(len(keys))]
		switch rng.Intn(4) {
		case 0:
			v := val{id: uint64(op), size: uint64(rng.Intn(100)), tid: int32(op % 7)}
			m.Put(k, v)
			ref[k] = v
		case 1:
			m.Slot(k).size++
			v := ref[k]
			v.size++
			ref[k] = v
		case 2:
			got, ok := m.Take(k)
			want, wok := ref[k]
			delete(ref, k)
			if ok != wok || got != want {
				t.Fatalf("op %d: Take(%#x) = %v %v, want %v %v", op, k, got, ok, want, wok)
			}
		default:
			got, ok := m.Get(k)
			want, wok := ref[k]
			if ok != wok || got != want || m.Has(k) != wok {
				t.Fatalf("op %d: Get(%#x) = %v %v, want %v %v", op, k, got, ok, want, wok)
			}
			// A change right after a look at the same key (the look's
			// memo), present or not.
			switch rng.Intn(3) {
			case 0:
				v := val{id: uint64(op), tid: 1}
				m.Put(k, v)
				ref[k] = v
			case 1:
				got, ok := m.Take(k)
				if ok != wok || got != want {
					t.Fatalf("op %d: Take(%#x) after a look = %v %v, want %v %v", op, k, got, ok, want, wok)
				}
				delete(ref, k)
			}
		}
		if m.Len() != len(ref) {
			t.Fatalf("op %d: %d keys, want %d", op, m.Len(), len(ref))
		}
	}
	seen := 0
	m.Each(func(k uint64, v *val) {
		if ref[k] != *v {
			t.Fatalf("Each: %#x = %v, want %v", k, *v, ref[k])
		}
		seen++
	})
	if seen != len(ref) {
		t.Fatalf("Each saw %d keys, want %d", seen, len(ref))
	}
	for k, want := range ref {
		if got, ok := m.Take(k); !ok || got != want {
			t.Fatalf("final Take(%#x) = %v %v, want %v", k, got, ok, want)
		}
	}
	if m.Len() != 0 {
		t.Fatalf("%d keys left", m.Len())
	}
}
