package spool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"

	"msmemscope/format"
)

// logSpool is a rotating capture's logs and late.bin read in place as one
// raw spool: the oldest log whole, then the later logs and late.bin without
// their headers, as if one file. Nothing is written to disk and the logs are
// not held decompressed: a frame is decompressed when read, and the few read
// last are kept (the reader goes through the spool in time order, so through
// the frames roughly in order).
type logSpool struct {
	parts []logPart
	size  int64
	files []*os.File
	// Where each log after the first lies ([start, end)): its inherited
	// repeats the blocks live then, which the logs before it hold (NewLogs).
	laterLogs [][2]int64
	// The logs that end with a frame cut short or damaged, and why: the
	// newest log of a killed run; in a run that ended, a damaged file.
	damaged []string

	mu    sync.Mutex
	cache [logCacheFrames]struct {
		part int
		data []byte
	}
	next int // the cache slot to fill next
}

// logCacheFrames is how many decompressed frames are kept.
const logCacheFrames = 16

// logPart is a run of the combined spool: a zstd frame of a log, raw bytes
// of late.bin, or the decoded end of a damaged log.
type logPart struct {
	off, n     int64 // its place in the combined spool
	f          *os.File
	zoff, zlen int64  // the frame's place in f; zlen 0: raw bytes of f from zoff
	skip       int64  // bytes of its content before off (a later log's header)
	mem        []byte // the content, when decoded at open
}

func openLogSpool(dir string) (*logSpool, error) {
	ls := &logSpool{}
	for i := range ls.cache {
		ls.cache[i].part = -1
	}
	logs := LogFiles(dir)
	for i, path := range logs {
		start := ls.size
		cut := len(ls.damaged)
		if err := ls.addLog(path, i > 0); err != nil {
			ls.Close()
			return nil, err
		}
		if len(ls.damaged) > cut {
			// Cut short: the newest log of a killed run, late.bin after
			// it; or an older one, killed while a cut settled.
			from := start
			if i == 0 {
				from = HdrSize
			}
			if err := ls.endOnChunk(from); err != nil {
				ls.Close()
				return nil, fmt.Errorf("%s: %v", path, err)
			}
		}
		if i > 0 { // its inherited blocks are in the logs before it
			ls.laterLogs = append(ls.laterLogs, [2]int64{start, ls.size})
		}
	}
	late := filepath.Join(dir, SpoolDir, LateFile)
	if f, err := os.Open(late); err == nil {
		var hdr [HdrSize]byte
		fi, serr := f.Stat()
		if _, err := f.ReadAt(hdr[:], 0); err == nil && serr == nil && fi.Size() > HdrSize && strings.HasPrefix(string(hdr[:]), Magic) {
			ls.files = append(ls.files, f)
			ls.add(logPart{f: f, zoff: HdrSize, n: fi.Size() - HdrSize})
		} else {
			f.Close()
		}
	}
	return ls, nil
}

func (ls *logSpool) add(p logPart) {
	p.off = ls.size
	ls.parts = append(ls.parts, p)
	ls.size += p.n
}

// addLog indexes the frames of one log, decompressing each once to check it
// (and learn its size). Where a frame is damaged, the log ends before it;
// where one is cut off by a kill, with the blocks a stream decoder still
// gets from it (salvageFrames, as ReadLog).
func (ls *logSpool) addLog(path string, skipHeader bool) error {
	z, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	ls.files = append(ls.files, f)
	skip := int64(0)
	if skipHeader {
		skip = HdrSize
	}
	var content int64 // of this log so far
	var head []byte   // its first bytes, to check the header
	addContent := func(p logPart, data []byte) {
		if len(head) < HdrSize {
			head = append(head, data[:min(len(data), HdrSize-len(head))]...)
		}
		content += int64(len(data))
		cut := min(skip, int64(len(data)))
		skip -= cut
		p.skip, p.n = cut, int64(len(data))-cut
		if p.mem != nil {
			p.mem = p.mem[cut:]
			p.skip = 0
		}
		if p.n > 0 {
			ls.add(p)
		}
	}
	var buf []byte
	for off := int64(0); off < int64(len(z)); {
		n, err := frameSize(z[off:])
		if err == nil {
			buf, err = logDecoder.DecodeAll(z[off:off+n], buf[:0])
		}
		if err != nil {
			out, serr := salvageFrames(z[off:])
			if serr != nil {
				return fmt.Errorf("%s: %v", path, serr)
			}
			if len(out) > 0 {
				addContent(logPart{mem: out}, out)
			}
			if content < HdrSize {
				return fmt.Errorf("%s: %v", path, err)
			}
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			ls.damaged = append(ls.damaged, fmt.Sprintf("%s: %v", path, err))
			break
		}
		if len(buf) > 0 {
			addContent(logPart{f: f, zoff: off, zlen: n}, buf)
		}
		off += n
	}
	if len(head) < HdrSize || string(head[:8]) != Magic {
		return fmt.Errorf("%s: not an msmemscope log", path)
	}
	if n := binary.LittleEndian.Uint64(head[logSeqOff:]); n != 0 && int64(n) != int64(logSeq(path)) {
		// Read in name order: a log out of its place would give blocks
		// freed, and freed ones live.
		return fmt.Errorf("%s: the file holds log %d: a log renamed or copied over another", path, n)
	}
	return nil
}

// endOnChunk makes the combined spool, whose chunks from byte from on are
// one log's, end where a chunk does: a log cut short inside a chunk (the
// records a kill left of a frame) is followed by the next log's, or by
// late.bin's, which the chunk's length would otherwise run into. That chunk ends where its whole
// units do (its length and checksum made anew: the whole events in it are
// read, as those of a spool's last chunk cut short); a header cut short goes.
func (ls *logSpool) endOnChunk(from int64) error {
	var ch [ChunkHdrSize]byte
	off := from
	for off+ChunkHdrSize <= ls.size {
		if _, err := ls.ReadAt(ch[:], off); err != nil {
			return err
		}
		end := off + ChunkHdrSize + int64(binary.LittleEndian.Uint32(ch[format.ChunkNUnitOff:]))*UnitSize
		if end > ls.size {
			break
		}
		off = end
	}
	if off == ls.size {
		return nil
	}
	var fixed []byte
	if units := (ls.size - off - ChunkHdrSize) / UnitSize; off+ChunkHdrSize <= ls.size && units > 0 {
		fixed = make([]byte, ChunkHdrSize+units*UnitSize)
		if _, err := ls.ReadAt(fixed, off); err != nil {
			return err
		}
		tid := int32(binary.LittleEndian.Uint32(fixed[format.ChunkTidOff:]))
		binary.LittleEndian.PutUint32(fixed[format.ChunkNUnitOff:], uint32(units))
		binary.LittleEndian.PutUint32(fixed[format.ChunkCRCOff:], ChunkCRC(tid, fixed[ChunkHdrSize:]))
	}
	// Drop the parts from off on, and the rest of the one it falls in.
	i := sort.Search(len(ls.parts), func(i int) bool { return ls.parts[i].off+ls.parts[i].n > off })
	if i < len(ls.parts) && ls.parts[i].off < off {
		pt := &ls.parts[i]
		pt.n = off - pt.off
		if pt.mem != nil {
			pt.mem = pt.mem[:pt.n]
		}
		i++
	}
	ls.parts = ls.parts[:i]
	ls.size = off
	if fixed != nil {
		ls.add(logPart{mem: fixed, n: int64(len(fixed))})
	}
	return nil
}

// frameSize is the length of the zstd frame (or skippable frame) at the
// start of z, read from its header and block headers.
func frameSize(z []byte) (int64, error) {
	var h zstd.Header
	if err := h.Decode(z); err != nil {
		return 0, err
	}
	if h.Skippable {
		return int64(h.HeaderSize) + int64(h.SkippableSize), nil
	}
	off := int64(h.HeaderSize)
	for {
		if off+3 > int64(len(z)) {
			return 0, io.ErrUnexpectedEOF
		}
		bh := uint32(z[off]) | uint32(z[off+1])<<8 | uint32(z[off+2])<<16
		size := int64(bh >> 3)
		if (bh>>1)&3 == 1 { // an RLE block holds one byte
			size = 1
		}
		off += 3 + size
		if bh&1 != 0 {
			break
		}
	}
	if h.HasCheckSum {
		off += 4
	}
	if off > int64(len(z)) {
		return 0, io.ErrUnexpectedEOF
	}
	return off, nil
}

// ReadAt reads the combined spool.
func (ls *logSpool) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	done := 0
	i := sort.Search(len(ls.parts), func(i int) bool { return ls.parts[i].off+ls.parts[i].n > off })
	for ; done < len(p) && i < len(ls.parts); i++ {
		pt := &ls.parts[i]
		from := off + int64(done) - pt.off
		var n int
		switch {
		case pt.mem != nil:
			n = copy(p[done:], pt.mem[from:])
		case pt.zlen == 0:
			want := p[done:min(len(p), done+int(pt.n-from))]
			m, err := pt.f.ReadAt(want, pt.zoff+from)
			if err != nil && m < len(want) {
				return done + m, err
			}
			n = m
		default:
			m, err := ls.readFrame(i, p[done:], pt.skip+from)
			if err != nil {
				return done, err
			}
			n = m
		}
		done += n
	}
	if done < len(p) {
		return done, io.EOF
	}
	return done, nil
}

// readFrame copies part i's decompressed frame from byte from into dst,
// decompressing it unless it is cached.
func (ls *logSpool) readFrame(i int, dst []byte, from int64) (int, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	pt := &ls.parts[i]
	for _, c := range ls.cache {
		if c.part == i {
			return copy(dst, c.data[from:pt.skip+pt.n]), nil
		}
	}
	z := make([]byte, pt.zlen)
	if _, err := pt.f.ReadAt(z, pt.zoff); err != nil {
		return 0, err
	}
	slot := &ls.cache[ls.next]
	ls.next = (ls.next + 1) % logCacheFrames
	data, err := logDecoder.DecodeAll(z, slot.data[:0])
	if err != nil || int64(len(data)) < pt.skip+pt.n {
		slot.part = -1
		return 0, fmt.Errorf("%s: a frame changed since it was read: %v", pt.f.Name(), err)
	}
	slot.part, slot.data = i, data
	return copy(dst, data[from:pt.skip+pt.n]), nil
}

func (ls *logSpool) Close() error {
	for _, f := range ls.files {
		f.Close()
	}
	ls.files = nil
	return nil
}

// salvageFrames reads what can be trusted of frames that do not decode
// whole: a frame cut off by a kill gives its blocks before the cut (a
// stream decoder's output), a damaged frame (whole on disk, its content
// not matching its checksum, say) nothing, and the read ends there.
func salvageFrames(z []byte) ([]byte, error) {
	var out []byte
	for len(z) > 0 {
		n, err := frameSize(z)
		if err != nil { // cut short
			d, derr := zstd.NewReader(bytes.NewReader(z), zstd.WithDecoderConcurrency(1))
			if derr != nil {
				return nil, derr
			}
			var b bytes.Buffer
			_, _ = io.Copy(&b, d)
			d.Close()
			return append(out, b.Bytes()...), nil
		}
		before := len(out)
		if out, err = logDecoder.DecodeAll(z[:n], out); err != nil {
			return out[:before], nil // damaged: nothing of it
		}
		z = z[n:]
	}
	return out, nil
}
