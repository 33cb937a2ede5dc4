package intern

import "testing"

func TestTable(t *testing.T) {
	var tab Table
	if _, ok := tab.Lookup("a"); ok {
		t.Fatal("found in an empty table")
	}
	a, b := tab.ID("a"), tab.ID("b")
	if a != 0 || b != 1 || tab.ID("a") != 0 || tab.Len() != 2 || tab.Name(1) != "b" {
		t.Fatalf("ids a=%d b=%d, len %d", a, b, tab.Len())
	}
	if i, ok := tab.Lookup("b"); !ok || i != 1 || len(tab.Names()) != 2 {
		t.Fatalf("lookup b: %d %v", i, ok)
	}
}
