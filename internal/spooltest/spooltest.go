// Package spooltest builds spool bytes for the tests of the packages that
// read spools.
package spooltest

import (
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
