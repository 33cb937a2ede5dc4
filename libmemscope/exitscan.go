package libmemscope

/*
#include "hook.h"
void ms_emit(uint16_t kind, uint16_t flags, uint64_t a, uint64_t b, const void *payload, uint32_t plen);
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
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
	if err := scanLeaks(uint64(sp)); err != nil {
		fmt.Fprintf(os.Stderr, "msmemscope: leak kinds: %v\n", err)
	}
	if eng.convertLate {
		convertAtExit()
	}
}

// scanLeaks sorts the blocks alive now into leak kinds and records them
// (R_KINDS) after everything else in the spool.
func scanLeaks(sp uint64) error {
	var blocks []leakscan.Block
	if eng.rot != nil {
		// Rotating logs: the rotator knows the live blocks (the oldest
		// logs are gone).
		addrs, sizes := eng.rot.LiveHost()
		for i := range addrs {
			blocks = append(blocks, leakscan.Block{Addr: addrs[i], Size: sizes[i]})
		}
		sort.Slice(blocks, func(i, j int) bool { return blocks[i].Addr < blocks[j].Addr })
	} else {
		var err error
		if blocks, err = leakscan.LiveFromSpool(filepath.Join(eng.proc.Dir, spool.SpoolDir, spool.FileName)); err != nil {
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
	p := &leakscan.Process{Maps: maps, Own: ownRegions(maps), StackSP: sp, ThreadSP: leakscan.ThreadStackPointers(nil)}
	var regs [6]uint64
	if C.ms_exit_regs((*C.uint64_t)(unsafe.Pointer(&regs[0]))) == 0 {
		regs = [6]uint64{}
	}
	kinds := leakscan.Classify(blocks, p.Roots(blocks), regs[:], mem)
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
	buf := make([]uint64, 2*8192)
	n := int(C.ms_own_regions((*C.uint64_t)(unsafe.Pointer(&buf[0])), C.int(len(buf)/2)))
	var own []leakscan.Region
	for i := 0; i < min(n, len(buf)/2); i++ {
		own = append(own, leakscan.Region{Lo: buf[2*i], Hi: buf[2*i+1]})
	}
	self := uint64(uintptr(unsafe.Pointer(C.ms_exit_sp)))
	goHeap := uint64(uintptr(unsafe.Pointer(goHeapObject)))
	var selfPath string
	for _, m := range maps {
		if self >= m.Lo && self < m.Hi {
			selfPath = m.Path
		}
	}
	for _, m := range maps {
		switch {
		case selfPath != "" && m.Path == selfPath:
			own = append(own, leakscan.Region{Lo: m.Lo, Hi: m.Hi})
		case m.Path == "" && goHeap >= 0xc000000000 && goHeap < 0x10000000000 && m.Lo >= 0xc000000000 && m.Lo < 0x10000000000,
			goHeap >= m.Lo && goHeap < m.Hi:
			own = append(own, leakscan.Region{Lo: m.Lo, Hi: m.Hi}) // the Go heap (its arenas start at 0xc000000000)
		}
	}
	return own
}

// convertAtExit writes the files of a capture no CLI will convert.
func convertAtExit() {
	if _, err := collect.Convert(eng.proc.Dir, collect.Options{Console: os.Stderr}); err != nil {
		fmt.Fprintf(os.Stderr, "msmemscope: %v\n", err)
	}
}
