package analyzer

import (
	"math"
	"math/rand"
	"testing"
)

// TestLeakLiveAgainstAMap: blocks added, taken and looked up at random, ids
// freed soon (held in recent) or late (moved on when a later id takes their
// slot), answer as a plain map does, and each visits every live block once.
func TestLeakLiveAgainstAMap(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var l leakLive
	want := map[uint64]int{} // id -> step
	var ids []uint64
	next := uint64(1)
	for op := 0; op < 200_000; op++ {
		switch r := rng.Intn(10); {
		case r < 5 || len(ids) == 0: // a new block
			id := next
			next += 1 + uint64(rng.Intn(3)) // gaps: slots shared unevenly
			step := rng.Intn(5)
			l.add(Leak{AllocID: id, Ptr: id * 16, Size: id % 100, Step: step, Type: "HOST", Owner: []string{"a", "b"}[id%2]})
			want[id] = step
			ids = append(ids, id)
		default: // free a recent one mostly, now and then an old one
			k := len(ids) - 1 - rng.Intn(min(len(ids), 300))
			if rng.Intn(20) == 0 {
				k = rng.Intn(len(ids))
			}
			id := ids[k]
			ids[k] = ids[len(ids)-1]
			ids = ids[:len(ids)-1]
			step, ok := l.take(id)
			if !ok || step != want[id] {
				t.Fatalf("take(%d) = %d, %v; want %d, true", id, step, ok, want[id])
			}
			delete(want, id)
			if _, ok := l.take(id); ok {
				t.Fatalf("take(%d) twice", id)
			}
		}
		if op%997 == 0 && len(ids) > 0 {
			id := ids[rng.Intn(len(ids))]
			if b, ok := l.get(id); !ok || b.AllocID != id || b.Ptr != id*16 || b.Step != want[id] || b.Owner != []string{"a", "b"}[id%2] {
				t.Fatalf("get(%d) = %+v, %v", id, b, ok)
			}
		}
	}
	seen := map[uint64]bool{}
	l.each(func(b Leak) {
		if seen[b.AllocID] {
			t.Fatalf("each: %d twice", b.AllocID)
		}
		seen[b.AllocID] = true
		if _, ok := want[b.AllocID]; !ok {
			t.Fatalf("each: %d is not live", b.AllocID)
		}
	})
	if len(seen) != len(want) {
		t.Fatalf("each visited %d blocks, %d live", len(seen), len(want))
	}
	waiting := 0
	l.eachRecent(func(b *leakBlock) {
		if b.step >= 2 && !b.judged {
			waiting++
		}
	})
	if waiting != l.waiting {
		t.Fatalf("waiting = %d, the recent slots hold %d blocks of step >= 2", l.waiting, waiting)
	}
}

// TestLeakLiveLargestID: the largest allocation id (whose id + 1 wraps to
// an empty slot's mark) is a block like any other, and no empty slot
// answers for it.
func TestLeakLiveLargestID(t *testing.T) {
	var l leakLive
	l.add(Leak{AllocID: 1, Step: 1})
	if _, ok := l.take(math.MaxUint64); ok {
		t.Fatal("take of an id never added found a block")
	}
	if moved := l.add(Leak{AllocID: math.MaxUint64, Step: 3}); moved == nil || moved.allocID != math.MaxUint64 {
		t.Fatalf("add returned %+v, want the block itself (it goes to the map)", moved)
	}
	n := 0
	l.each(func(Leak) { n++ })
	if b, ok := l.get(math.MaxUint64); !ok || b.Step != 3 || n != 2 {
		t.Fatalf("get = %+v, %v; each saw %d blocks, want 2", b, ok, n)
	}
	if step, ok := l.take(math.MaxUint64); !ok || step != 3 {
		t.Fatalf("take = %d, %v", step, ok)
	}
}
