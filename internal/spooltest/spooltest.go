// Package spooltest builds spool bytes, and reads spools back, for the
// tests of the packages that read spools.
package spooltest

import (
	"testing"

	"msmemscope/format"
	"msmemscope/spool"
)

// Chunk is one chunk of thread tid holding recs as full records.
func Chunk(tid int32, recs ...spool.Rec) []byte {
	var body []byte
	for i := range recs {
		body = spool.AppendRec(body, &recs[i])
	}
	return spool.AppendChunk(nil, format.ChunkMagic, tid, body)
}

// Each hands fn every record sp's Reader gives, in time order, with its time
// in nanoseconds; a read error fails t.
func Each(t testing.TB, sp *spool.Spool, fn func(r *spool.Rec, ns uint64)) {
	t.Helper()
	rd := sp.Reader()
	for {
		r, ns, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if r == nil {
			return
		}
		fn(r, ns)
	}
}
