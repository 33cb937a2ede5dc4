package capture

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// A log's frames are zstd frames. A batch the drain took while the program
// records flat out is stored as it is (raw blocks) unless its events
// compress well: compressing costs ~40 ns an event, more than the rest of
// the drain's work, and such a program waits for the drain (the
// microbenchmark, whose events compress to a quarter: loop 1.5 times as
// long compressed). Events that compress 8 times or more (repeated sizes,
// addresses and stacks) are compressed all the same: the logs then hold
// that many times the history. A stored batch must also be small against
// its log (a sixteenth: logs of 8 MiB or more) and fit in what is left of
// it (a new log grows while its cut settles, at least 50 ms: compressed,
// it grows a quarter as much). Smaller batches, of a program with time to
// spare, are always compressed, as is all else a log holds.

// BatchMax is the most a drained batch holds: a sixteenth of a log, 1 MiB
// (the largest record, a Python code object's, fits) to 8 MiB.
func (r *Rotator) BatchMax() int {
	return int(min(max(r.maxBytes/16, 1<<20), 8<<20))
}

// storeFrom is the least a batch stored holds: ~40 k events, more than a
// millisecond of the drain's work.
const storeFrom = 512 << 10

// storeProbe: one busy batch in this many is compressed all the same, to
// see whether the events compress well now.
const storeProbe = 16

// storeBatch reports whether a batch of n raw bytes for lf is stored, not
// compressed (Rotator.storeAll: tests of stored frames store every one).
func (r *Rotator) storeBatch(lf *logFile, n int) bool {
	if r.storeAll {
		return true
	}
	if n < storeFrom || int64(n) > r.maxBytes/16 || lf.size()+int64(n) > r.maxBytes {
		return false
	}
	r.busy++
	// Compressed to an eighth or less lately, or a probe: compress.
	return r.zOut*8 > r.zRaw && r.busy%storeProbe != 0
}

// storedSize is the size of a stored frame of n raw bytes.
func storedSize(n int) int64 {
	return int64(4+1+4+4+n) + 3*int64(max(1, (n+zstdBlockMax-1)/zstdBlockMax))
}

// zstdBlockMax is the largest block a zstd frame holds.
const zstdBlockMax = 128 << 10

// encodeFrame appends raw to dst as one zstd frame, stored or compressed.
func (r *Rotator) encodeFrame(dst, raw []byte, store bool) []byte {
	if store {
		return storedFrame(dst, raw)
	}
	z := r.enc.EncodeAll(raw, dst)
	// The ratio of the latest compressed frames, older ones fading out.
	r.zRaw = r.zRaw - r.zRaw/8 + uint64(len(raw))
	r.zOut = r.zOut - r.zOut/8 + uint64(len(z)-len(dst))
	return z
}

// storedFrame appends src to dst as a zstd frame of raw blocks: any zstd
// reader takes it, and a frame cut short or damaged is told as a
// compressed one is (its size is in its header, its content's checksum
// after it, as the encoder's frames have).
func storedFrame(dst, src []byte) []byte {
	sum := uint32(xxhash.Sum64(src))
	dst = binary.LittleEndian.AppendUint32(dst, 0xFD2FB528) // the frame's magic
	// Its descriptor: a 4-byte content size, a single segment (no window
	// size), a checksum, no dictionary.
	dst = append(dst, 2<<6|1<<5|1<<2)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(src)))
	for {
		n := min(len(src), zstdBlockMax)
		last := uint32(0)
		if n == len(src) {
			last = 1
		}
		h := uint32(n)<<3 | last // block type 0: raw
		dst = append(dst, byte(h), byte(h>>8), byte(h>>16))
		dst = append(dst, src[:n]...)
		src = src[n:]
		if last == 1 {
			return binary.LittleEndian.AppendUint32(dst, sum)
		}
	}
}
