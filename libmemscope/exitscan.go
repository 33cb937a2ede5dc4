package libmemscope

/*
#include "hook.h"
void ms_emit(uint16_t kind, uint16_t flags, uint64_t a, uint64_t b, const void *payload, uint32_t plen);
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"msmemscope/internal/logx"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"unsafe"

	"msmemscope/collect"
	"msmemscope/format"
	"msmemscope/leakscan"
	"msmemscope/spool"
)

// kindsPerRecord is how many blocks one R_KINDS record holds (a record
// written after the final drain holds 1024 payload units).
const kindsPerRecord = 1024

// goHeapObject keeps a Go heap address to find the Go heap's mappings by.
var goHeapObject = new([64]byte)

//export msGoLeakScan
func msGoLeakScan(sp C.uint64_t) {
	eng.mu.Lock()
	defer eng.mu.Unlock()
	if !eng.finished || eng.proc == nil {
		return
	}
	// Only the leaks analysis reads the kinds (a later --input with it
	// gives N/A).
	if slices.Contains(eng.cfg.Analysis, "leaks") {
		if err := scanLeaks(uint64(sp)); err != nil {
			fmt.Fprintf(os.Stderr, "msmemscope: leak kinds: %v\n", err)
		}
	}
	if eng.endLate {
		endCapture()
		eng.endLate = false
	}
	if eng.convertLate {
		convertAtExit()
		eng.convertLate = false
	}
}

// scanLeaks sorts the blocks alive now into leak kinds and records them
// (R_KINDS) after everything else in the spool.
func scanLeaks(sp uint64) error {
	// The program's other threads stand still from before the live blocks
	// are listed until their memory is read: one still allocating would
	// otherwise free listed blocks (read then as lost) and add unlisted ones.
	st := stopThreads()
	defer resumeThreads()
	var blocks []leakscan.Block
	if eng.rot != nil {
		// Rotating logs: the rotator knows the live blocks (the oldest
		// logs are gone).
		for _, b := range eng.rot.LiveHost() {
			blocks = append(blocks, leakscan.Block{Addr: b.Addr, Size: b.Size, N: b.N})
		}
		sort.Slice(blocks, func(i, j int) bool { return blocks[i].Addr < blocks[j].Addr })
	} else {
		var err error
		if blocks, err = liveBlocks(filepath.Join(eng.proc.Dir, spool.SpoolDir, spool.FileName)); err != nil {
			return err
		}
	}
	text, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return err
	}
	maps := leakscan.ReadMaps(text)
	mem, err := leakscan.OpenSelf(maps)
	if err != nil {
		return err
	}
	defer mem.Close()
	leakscan.FillUsable(blocks, mem)
	threadSP := append(st.sps, leakscan.ThreadStackPointers(st.tids)...)
	p := &leakscan.Process{Maps: maps, Own: ownRegions(maps), StackSP: sp, ThreadSP: threadSP, Dead: deadStacks()}
	var regs [6]uint64
	if C.ms_exit_regs((*C.uint64_t)(unsafe.Pointer(&regs[0]))) == 0 {
		regs = [6]uint64{}
	}
	kinds := leakscan.Classify(blocks, p.Roots(blocks, mem), append(regs[:], st.regs...), mem)
	resumeThreads()
	units := make([]byte, 0, kindsPerRecord*8)
	if len(blocks) == 0 { // the scan ran: nothing was left
		C.ms_emit(C.uint16_t(format.RKinds), 0, 0, 0, nil, 0)
	}
	for i := 0; i < len(blocks); i += kindsPerRecord {
		units = units[:0]
		end := min(i+kindsPerRecord, len(blocks))
		for j := i; j < end; j++ {
			units = binary.LittleEndian.AppendUint64(units, blocks[j].Addr|uint64(kinds[j])<<56)
		}
		C.ms_emit(C.uint16_t(format.RKinds), 0, C.uint64_t(end-i), 0, unsafe.Pointer(&units[0]), C.uint32_t(len(units)))
	}
	return nil
}

// ownRegions are msmemscope's memory: the C side's mappings, this library's
// file, and the Go heap.
func ownRegions(maps []leakscan.Mapping) []leakscan.Region {
	buf := make([]uint64, 2*65536)
	n := int(C.ms_own_regions((*C.uint64_t)(unsafe.Pointer(&buf[0])), C.int(len(buf)/2)))
	if n > len(buf)/2 {
		logx.Warnf("more than %d mappings of its own: leak kinds may call lost blocks reachable", len(buf)/2)
	}
	var own []leakscan.Region
	for i := 0; i < min(n, len(buf)/2); i++ {
		own = append(own, leakscan.Region{Lo: buf[2*i], Hi: buf[2*i+1]})
	}
	self := uint64(uintptr(unsafe.Pointer(C.ms_exit_sp)))
	var selfPath string
	for _, m := range maps {
		if self >= m.Lo && self < m.Hi {
			selfPath = m.Path
		}
	}
	// The Go heap: the 64 MiB arenas that hold objects of each size class
	// range (small, large, the drain buffer), and the mappings around them.
	// Every mapping the runtime makes through cgo's mmap is noted already
	// (own_map); these probes stand where it maps otherwise.
	var arenas []leakscan.Region
	small, mid, large := new([16]byte), new([32 << 10]byte), make([]byte, 4<<20)
	probes := []unsafe.Pointer{unsafe.Pointer(goHeapObject), unsafe.Pointer(small), unsafe.Pointer(mid), unsafe.Pointer(&large[0])}
	if len(eng.buf) > 0 {
		probes = append(probes, unsafe.Pointer(&eng.buf[0]))
	}
	for _, p := range probes {
		a := uint64(uintptr(p)) &^ (goArena - 1)
		arenas = append(arenas, leakscan.Region{Lo: a, Hi: a + goArena})
	}
	for _, m := range maps {
		switch {
		case selfPath != "" && m.Path == selfPath:
			own = append(own, leakscan.Region{Lo: m.Lo, Hi: m.Hi})
		case m.Path == "" && slices.ContainsFunc(arenas, func(a leakscan.Region) bool { return m.Lo < a.Hi && a.Lo < m.Hi }):
			own = append(own, leakscan.Region{Lo: m.Lo, Hi: m.Hi})
		}
	}
	runtime.KeepAlive(small)
	runtime.KeepAlive(mid)
	runtime.KeepAlive(large)
	return own
}

// goArena is the Go heap's arena size on linux/amd64.
const goArena = 64 << 20

// convertAtExit writes the files of a capture no CLI will convert.
func convertAtExit() {
	if _, err := collect.Convert(eng.proc.Dir, collect.Options{Console: os.Stderr, KeepLogs: eng.cfg.LogMode == "rotate"}); err != nil {
		fmt.Fprintf(os.Stderr, "msmemscope: %v\n", err)
	}
}

// deadStacks are the stacks of the program's threads that ended.
func deadStacks() []leakscan.Region {
	buf := make([]uint64, 2*4096)
	n := int(C.ms_dead_stacks((*C.uint64_t)(unsafe.Pointer(&buf[0])), C.int(len(buf)/2)))
	out := make([]leakscan.Region, n)
	for i := range out {
		out[i] = leakscan.Region{Lo: buf[2*i], Hi: buf[2*i+1]}
	}
	return out
}
