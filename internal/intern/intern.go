// Package intern numbers strings: the same string always gets the same
// small id, from 0 in the order first seen, so that what repeats on every
// event (a type, an owner, an operator's name) is kept and compared as an
// integer.
package intern

// Table is a set of interned strings; the zero value is ready to use.
type Table struct {
	ids   map[string]int32
	names []string
}

// ID returns s's id, giving it the next one if s is new.
func (t *Table) ID(s string) int32 {
	if i, ok := t.ids[s]; ok {
		return i
	}
	if t.ids == nil {
		t.ids = map[string]int32{}
	}
	i := int32(len(t.names))
	t.ids[s] = i
	t.names = append(t.names, s)
	return i
}

// Lookup returns s's id, if s was interned.
func (t *Table) Lookup(s string) (int32, bool) {
	i, ok := t.ids[s]
	return i, ok
}

// Name returns the string of id i.
func (t *Table) Name(i int32) string { return t.names[i] }

// Names returns every string, by id.
func (t *Table) Names() []string { return t.names }

// Len is the number of strings interned.
func (t *Table) Len() int { return len(t.names) }
