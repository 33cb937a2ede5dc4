package spool

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/trace"
)

func units(v ...uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[i*8:], x)
	}
	return b
}

// R_VMAP and R_VUNMAP make MAP and UNMAP rows of Event Type HAL that hold
// no memory (no live block, no Size); one recorded while collection was
// off makes none; an unmap whose handle the library did not know names
// none; no device known is host, as a VMM MALLOC's.
func TestDecodeVMMMappings(t *testing.T) {
	const va, h = 0x7c0000000000, 0x1000
	dev := func(d uint64) uint64 { return (d + 1) << format.DevBDevShift }
	sb := newSpoolBuilder(7)
	sb.chunk(5, calib(1000, 1),
		rec{ts: 1001, a: va, b: 2<<20 | dev(1), kind: format.RVmmMap, payload: units(0, h)},
		rec{ts: 1002, a: va + 2<<20, b: 1<<20 | dev(0), kind: format.RVmmMap, flags: format.FOff, payload: units(1<<20, h)},
		rec{ts: 1003, a: va, b: 2<<20 | dev(1), kind: format.RVmmUnmap, payload: units(h)},
		rec{ts: 1004, a: va + 4<<20, b: 1 << 20, kind: format.RVmmUnmap},
	)
	for _, fast := range []bool{false, true} {
		d := NewDecoder(sb.open(t), "", &ProcessMeta{Pid: 7}, config.Config{})
		d.fast = fast
		rows := decodeRows(t, d, func(e *trace.Event) string {
			return fmt.Sprintf("%v %s %s 0x%x %d %s", e.Kind, e.Type, e.Device, e.Ptr, e.Size, e.Attr())
		})
		want := []string{
			"MAP HAL 1 0x7c0000000000 0 {size:2097152,offset:0,handle:0x1000}",
			"UNMAP HAL 1 0x7c0000000000 0 {size:2097152,handle:0x1000}",
			"UNMAP HAL host 0x7c0000400000 0 {size:1048576}",
		}
		if fast {
			want = []string{"MAP HAL 1 0x7c0000000000 0 {}", "UNMAP HAL 1 0x7c0000000000 0 {}", "UNMAP HAL host 0x7c0000400000 0 {}"}
		}
		if !slices.Equal(rows, want) {
			t.Errorf("fast=%v: rows\n%q\nwant\n%q", fast, rows, want)
		}
		if d.live.Len() != 0 || d.Unwritten()[NotWrittenOff] != 1 || d.Events() != 4 {
			t.Errorf("fast=%v: %d live blocks, unwritten %v, %d events; want 0, 1 off, 4", fast, d.live.Len(), d.Unwritten(), d.Events())
		}
	}
}
