package spool

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// A log frame whose content does not match its checksum (damaged on disk)
// gives nothing, although a stream decoder hands out its content before it
// reads the checksum: the log reads as the frames before it, in place as
// read whole. A frame cut off by a kill still gives its blocks before the
// cut.
func TestDamagedFrameGivesNothing(t *testing.T) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderCRC(true))
	if err != nil {
		t.Fatal(err)
	}
	var hdr bytes.Buffer
	WriteHeader(&hdr, 42)
	a := append(hdr.Bytes(), bytes.Repeat([]byte("a"), 200)...)
	b, c := bytes.Repeat([]byte("b"), 300), bytes.Repeat([]byte("c"), 100)
	zb := enc.EncodeAll(b, nil)
	zb[len(zb)-1] ^= 1 // its checksum
	if _, err := logDecoder.DecodeAll(zb, nil); err == nil {
		t.Fatal("the damaged frame decodes")
	}
	z := append(append(enc.EncodeAll(a, nil), zb...), enc.EncodeAll(c, nil)...)
	path := filepath.Join(t.TempDir(), "log_000001.zst")
	if err := os.WriteFile(path, z, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadLog(path)
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("read %d bytes (%v), want the first frame's %d", len(got), err, len(a))
	}
	if out, err := salvageFrames(z[len(enc.EncodeAll(a, nil)):]); err != nil || len(out) != 0 {
		t.Fatalf("salvaged %d bytes of the damaged frame (%v)", len(out), err)
	}
	// Cut inside the third frame's one block: the first two frames whole (b
	// undamaged), nothing of the third.
	zb[len(zb)-1] ^= 1
	zc := enc.EncodeAll(c, nil)
	cut := append(append(enc.EncodeAll(a, nil), zb...), zc[:len(zc)/2]...)
	out, err := salvageFrames(cut)
	if err != nil || !bytes.Equal(out, append(append([]byte(nil), a...), b...)) {
		t.Fatalf("cut: salvaged %d bytes (%v), want %d", len(out), err, len(a)+len(b))
	}
}
