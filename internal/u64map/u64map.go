// Package u64map is a hash map from uint64 keys (addresses, allocation ids)
// to values: open addressing with linear probing and backward-shift
// deletion, at most half full. The decoder looks a block up two or three
// times per MALLOC and FREE, and Go's map spent a third of its time there;
// a value type without pointers leaves the collector nothing to scan.
package u64map

// Map is the map; its zero value is empty and ready.
type Map[V any] struct {
	// Runs says the keys come in runs of consecutive integers (allocation
	// ids; addresses in units of 1<<Grain bytes): runs of 64 then keep
	// together in the table, so that blocks allocated together are looked
	// up in nearby memory (a million live keys scattered by the hash missed
	// the cache at every look). A run's place in the table is hashed, and
	// so is its keys' offset within it, so strided keys spread out as well.
	// Set both before the first Put.
	Runs  bool
	Grain uint

	slots []slot[V]
	n     int
	shift uint // 64 - log2(len(slots))
	zero  *V   // the value at key 0, which marks an empty slot

	// The last look, for the change that often follows it (the decoder
	// asks whether an address is live, then adds or removes it): key
	// memoKey is at slot memoAt, or, if that slot is empty, would go
	// there. Any change forgets it (memoKey 0).
	memoKey uint64
	memoAt  int
}

type slot[V any] struct {
	key uint64
	val V
}

func (m *Map[V]) home(k uint64) int {
	if m.Runs { // the run's place by the hash, then the key's within it
		u := k >> m.Grain
		h := (u >> 6) * 0x9E3779B97F4A7C15
		return int(h>>(m.shift+6)<<6 | (u+h>>32)&63)
	}
	return int(k * 0x9E3779B97F4A7C15 >> m.shift)
}

// find returns k's slot index, or -1 (k ≠ 0).
func (m *Map[V]) find(k uint64) int {
	if m.n == 0 {
		return -1
	}
	if k == m.memoKey {
		if m.slots[m.memoAt].key == k {
			return m.memoAt
		}
		return -1
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		switch m.slots[i].key {
		case k:
			m.memoKey, m.memoAt = k, i
			return i
		case 0:
			m.memoKey, m.memoAt = k, i
			return -1
		}
	}
}

// Len is the number of keys.
func (m *Map[V]) Len() int {
	if m.zero != nil {
		return m.n + 1
	}
	return m.n
}

// Has reports whether k is in the map.
func (m *Map[V]) Has(k uint64) bool {
	if k == 0 {
		return m.zero != nil
	}
	return m.find(k) >= 0
}

// Get returns k's value.
func (m *Map[V]) Get(k uint64) (V, bool) {
	if p := m.Ptr(k); p != nil {
		return *p, true
	}
	var zero V
	return zero, false
}

// Ptr points at k's value, or is nil; valid until the next Put or Take.
func (m *Map[V]) Ptr(k uint64) *V {
	if k == 0 {
		return m.zero
	}
	if i := m.find(k); i >= 0 {
		return &m.slots[i].val
	}
	return nil
}

// Put sets k's value.
func (m *Map[V]) Put(k uint64, v V) { *m.Slot(k) = v }

// Slot points at k's value, adding k with the zero value if it is not in
// the map; valid until the next Put, Slot or Take.
func (m *Map[V]) Slot(k uint64) *V {
	if k == 0 {
		if m.zero == nil {
			m.zero = new(V)
		}
		return m.zero
	}
	if k == m.memoKey && 2*(m.n+1) <= len(m.slots) {
		m.memoKey = 0
		s := &m.slots[m.memoAt]
		if s.key == 0 { // (the look found k absent: its place)
			s.key = k
			m.n++
		}
		return &s.val
	}
	m.memoKey = 0
	if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
	mask := len(m.slots) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.key == k {
			return &s.val
		}
		if s.key == 0 {
			s.key = k
			m.n++
			return &s.val
		}
	}
}

// Take removes k and returns its value.
func (m *Map[V]) Take(k uint64) (V, bool) {
	var zero V
	if k == 0 {
		if m.zero == nil {
			return zero, false
		}
		v := *m.zero
		m.zero = nil
		return v, true
	}
	i := m.find(k)
	m.memoKey = 0
	if i < 0 {
		return zero, false
	}
	v := m.slots[i].val
	// Backward shift: move later entries of the probe run into the hole
	// when the hole lies between their home and their slot.
	mask := len(m.slots) - 1
	for j := (i + 1) & mask; m.slots[j].key != 0; j = (j + 1) & mask {
		if h := m.home(m.slots[j].key); (j-h)&mask >= (j-i)&mask {
			m.slots[i] = m.slots[j]
			i = j
		}
	}
	m.slots[i] = slot[V]{}
	m.n--
	return v, true
}

// Each calls fn on every key and its value, in no particular order; fn
// must not change the map.
func (m *Map[V]) Each(fn func(k uint64, v *V)) {
	if m.zero != nil {
		fn(0, m.zero)
	}
	for i := range m.slots {
		if s := &m.slots[i]; s.key != 0 {
			fn(s.key, &s.val)
		}
	}
}

func (m *Map[V]) grow() {
	old := m.slots
	size := max(2*len(old), 1024)
	m.slots, m.n = make([]slot[V], size), 0
	m.shift = 64
	for s := size; s > 1; s >>= 1 {
		m.shift--
	}
	for _, s := range old {
		if s.key != 0 {
			*m.Slot(s.key) = s.val
		}
	}
}
