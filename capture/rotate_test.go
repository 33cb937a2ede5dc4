package capture

import (
	"bytes"
	"encoding/binary"
	"math/rand"
	"path/filepath"
	"testing"

	"msmemscope/trace"
)

// chunkOf builds one drained chunk (spool chunk format) of 32-byte records.
func chunkOf(tid int32, recs [][4]uint64) []byte {
	var b bytes.Buffer
	writeChunkHeader(&b, uint32(len(recs)), tid, 42)
	for _, r := range recs {
		var h [trace.RecSize]byte
		binary.LittleEndian.PutUint64(h[0:], r[0])
		binary.LittleEndian.PutUint64(h[8:], r[1])
		binary.LittleEndian.PutUint64(h[16:], r[2])
		binary.LittleEndian.PutUint16(h[24:], uint16(r[3]))
		binary.LittleEndian.PutUint16(h[26:], trace.FHost)
		b.Write(h[:])
	}
	return b.Bytes()
}

func calibRec(tick, epoch uint64) []byte {
	var h [trace.RecSize]byte
	binary.LittleEndian.PutUint64(h[0:], tick)
	binary.LittleEndian.PutUint64(h[8:], tick)
	binary.LittleEndian.PutUint64(h[16:], epoch)
	binary.LittleEndian.PutUint16(h[24:], trace.RCalib)
	binary.LittleEndian.PutUint16(h[26:], trace.FEpoch)
	var b bytes.Buffer
	writeChunkHeader(&b, 1, 0, 42)
	b.Write(h[:])
	return b.Bytes()
}

// The run: 40 drains of 60 000 events each; every drain allocates 30 000
// blocks and frees 30 000, keeping every 1000th block alive for good.
func TestRotatorKeepsNSelfContainedFiles(t *testing.T) {
	dir := t.TempDir()
	r, err := NewRotator(dir, 42, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(1))
	kept := map[uint64]bool{}
	tick := uint64(1_000_000)
	var lastPtr uint64
	for d := 0; d < 40; d++ {
		var recs [][4]uint64
		for i := 0; i < 30000; i++ {
			ptr := 0x10000000 + uint64(d)*0x1000000 + uint64(i)*64 + uint64(rng.Intn(8))*8
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, uint64(16 + rng.Intn(500)), trace.RMalloc})
			if i%1000 == 0 {
				kept[ptr] = true
				continue
			}
			tick += 10
			recs = append(recs, [4]uint64{tick, ptr, 0, trace.RFree})
		}
		lastPtr = recs[len(recs)-1][1]
		if err := r.Write(append(calibRec(tick, uint64(d+1)), chunkOf(7, recs)...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, LogPrefix+"*"+LogSuffix))
	if len(files) != 3 {
		t.Fatalf("%d logs kept, want 3: %v", len(files), files)
	}
	if r.seq <= 3 {
		t.Fatalf("only %d logs were ever written: the test did not rotate", r.seq)
	}
	for i, f := range files {
		b, err := ReadLog(f)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := trace.NewSpool(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("%s does not parse alone: %v", f, err)
		}
		// Replay: every FREE must find its block (inherited or allocated here).
		live := map[uint64]bool{}
		inherited := 0
		rd := sp.Reader()
		var last uint64
		for {
			rec, _, err := rd.Next()
			if err != nil {
				t.Fatal(err)
			}
			if rec == nil {
				break
			}
			switch rec.Kind {
			case trace.RMalloc:
				live[rec.A] = true
				if rec.Flags&FInherit != 0 {
					inherited++
				}
				last = rec.A
			case trace.RFree:
				if !live[rec.A] {
					t.Fatalf("%s: FREE of %#x without its block", f, rec.A)
				}
				delete(live, rec.A)
				last = rec.A
			}
		}
		if inherited == 0 {
			t.Errorf("%s inherits no live blocks", f)
		}
		if i == len(files)-1 {
			if last != lastPtr {
				t.Errorf("the newest log ends at %#x, the run at %#x", last, lastPtr)
			}
			// Parsed alone, the newest log knows exactly the blocks still live.
			if len(live) != len(kept) {
				t.Errorf("newest log: %d live blocks at the end, want %d", len(live), len(kept))
			}
			for p := range kept {
				if !live[p] {
					t.Errorf("newest log lost kept block %#x", p)
					break
				}
			}
		}
	}
	if r.RawBytes == 0 || r.Written == 0 || r.Written >= r.RawBytes/4 {
		t.Errorf("compression: %d raw bytes -> %d written", r.RawBytes, r.Written)
	}
}
