package spool

import (
	"encoding/binary"
	"strconv"
	"strings"

	"github.com/ianlancetaylor/demangle"

	"msmemscope/format"
	"msmemscope/trace"
)

// isDevice reports whether a MALLOC or FREE is of CUDA memory.
func isDevice(flags uint16) bool {
	switch flags & format.FSubMask {
	case format.FHal, format.FVmm, format.FPinned:
		return true
	}
	return false
}

// BlockSize is a MALLOC's size: a device block's record carries its device
// and kind above the size.
func BlockSize(r *Rec) uint64 {
	if isDevice(r.Flags) {
		return r.B & format.DevBSize
	}
	return r.B
}

// noteDevAttr keeps the stream an R_DEVATTR gives its thread's next device
// MALLOC (the device and kind ride in the MALLOC itself).
func (d *Decoder) noteDevAttr(r *Rec) {
	if d.streams == nil {
		d.streams = map[int32]uint64{}
	}
	d.streams[r.Tid] = r.B
}

// devOf is the kind, device and stream of a device MALLOC, and whether it
// was an async allocation: the first two from its b, the stream from the
// R_DEVATTR its thread wrote just before it (async allocations only; a
// rotated log's repeat of the block has none).
func (d *Decoder) devOf(r *Rec) (uint8, int16, uint64, bool) {
	kind := uint8(r.B >> format.DevBKindShift)
	dev := devOfB(r.B)
	stream, async := d.streams[r.Tid]
	if async {
		delete(d.streams, r.Tid)
	}
	return kind, dev, stream, async
}

// devOfB is the CUDA ordinal in a device record's b (-1: none).
func devOfB(b uint64) int16 { return int16(b>>format.DevBDevShift&0xff) - 1 }

// deviceOf is a block's Device Id: its CUDA ordinal, or host.
func deviceOf(b block) string {
	if b.dev >= 0 {
		return strconv.Itoa(int(b.dev))
	}
	return trace.DeviceHost
}

var devKinds = map[uint8]string{format.DevDevice: "device", format.DevManaged: "managed", format.DevVMM: "vmm",
	format.DevPinned: "pinned"}

func setDevAttrs(e *trace.Event, b block, stream uint64) {
	if b.kind != format.DevPinned {
		e.Set("kind", devKinds[b.kind])
	}
	if stream != 0 {
		e.Set("stream", "0x"+strconv.FormatUint(stream, 16))
	}
}

// kernelLaunch is an R_KLAUNCH's row: "device\tname\tgrid\tblock"; grid
// and block are written 2x1x1, as tensor shapes are. None while collection
// was off.
func (d *Decoder) kernelLaunch(r *Rec, e *trace.Event) *trace.Event {
	if r.Flags&format.FOff != 0 {
		d.reason = NotWrittenOff
		return nil
	}
	f := strings.Split(r.Text(), "\t")
	if len(f) != 4 {
		return nil
	}
	e.Kind, e.Type = trace.KindKernelLaunch, trace.TypeKernel
	e.Device = trace.DeviceHost
	if f[0] != "-1" {
		e.Device = f[0]
	}
	e.Name = demangle.Filter(f[1])
	if !d.fast {
		e.Extra = append(e.Extra, trace.KV{Key: "streamId", Value: "0x" + strconv.FormatUint(r.A, 16)},
			trace.KV{Key: "grid", Value: strings.ReplaceAll(f[2], ",", "x")},
			trace.KV{Key: "block", Value: strings.ReplaceAll(f[3], ",", "x")})
	}
	return e
}

// oom is an R_OOM's row: a CUDA allocation the driver refused for want of
// memory, with the bytes asked (Attr size) and the device.
func (d *Decoder) oom(r *Rec, e *trace.Event) *trace.Event {
	if r.Flags&format.FOff != 0 {
		d.reason = NotWrittenOff
		return nil
	}
	kind := uint8(r.Flags & 0x7)
	e.Kind, e.Type = trace.KindOOM, trace.TypeHAL
	e.Device = trace.DeviceHost
	if kind == format.DevPinned {
		e.Type = trace.TypeHostPinned
	} else if r.A < 1<<15 {
		e.Device = strconv.Itoa(int(r.A))
	}
	e.Size = r.B
	if !d.fast {
		e.Set("size", strconv.FormatUint(r.B, 10)) // the Attr of an OOM row holds no typed size
		if k := devKinds[kind]; k != "" && kind != format.DevPinned {
			e.Set("kind", k)
		}
		e.CStack = d.cstack(r)
	}
	return e
}

// vmmMapping is an R_VMAP's or R_VUNMAP's row: a MAP or UNMAP of Event
// Type HAL, Ptr the virtual address, Device Id the handle's device; Attr
// size, offset (MAP) and handle (UNMAP: when the library knew it). The
// bytes are the handle's MALLOC's: the row's size stays out of Size, so
// that nothing sums it. None while collection was off.
func (d *Decoder) vmmMapping(r *Rec, e *trace.Event) *trace.Event {
	if d.torch != nil && d.torch.pre {
		d.torch.mapping(d, r) // (while collection is off too: a segment's handle is PyTorch's all the same)
	}
	if r.Flags&format.FOff != 0 {
		d.reason = NotWrittenOff
		return nil
	}
	e.Kind, e.Type = trace.KindMap, trace.TypeHAL
	if r.Kind == format.RVmmUnmap {
		e.Kind = trace.KindUnmap
	}
	e.Device = deviceOf(block{dev: devOfB(r.B)})
	e.Ptr, e.HasPtr = r.A, true
	if d.fast {
		return e
	}
	e.Extra = append(e.Extra, trace.KV{Key: "size", Value: strconv.FormatUint(r.B&format.DevBSize, 10)})
	pl := func(i int) (uint64, bool) {
		if len(r.Payload) < (i+1)*8 {
			return 0, false
		}
		return binary.LittleEndian.Uint64(r.Payload[i*8:]), true
	}
	if r.Kind == format.RVmmMap {
		off, _ := pl(0)
		h, _ := pl(1)
		e.Extra = append(e.Extra, trace.KV{Key: "offset", Value: strconv.FormatUint(off, 10)},
			trace.KV{Key: "handle", Value: "0x" + strconv.FormatUint(h, 16)})
	} else if h, ok := pl(0); ok && h != 0 {
		e.Extra = append(e.Extra, trace.KV{Key: "handle", Value: "0x" + strconv.FormatUint(h, 16)})
	}
	return e
}

// snapshot is an R_SNAPSHOT's row: "k:v,k:v" attrs, the host's (the PyTorch
// hooks': rss, heap, torch.cuda's figures) or a CUDA device's
// (cuMemGetInfo: device, free, total, used), whose device is the row's
// Device Id.
func (d *Decoder) snapshot(r *Rec, e *trace.Event) *trace.Event {
	if d.torch != nil && d.torch.pre {
		return nil // the pass that learns PyTorch's blocks makes no rows
	}
	e.Kind = trace.KindSnapshot
	e.Type = trace.NA
	e.Device = trace.DeviceHost
	for _, kv := range strings.Split(r.Text(), ",") {
		if k, v, ok := strings.Cut(kv, ":"); ok {
			if k == "device" {
				e.Device = v
				continue
			}
			e.Extra = append(e.Extra, trace.KV{Key: k, Value: trace.CleanAttrValue(v)})
		}
	}
	return e
}
