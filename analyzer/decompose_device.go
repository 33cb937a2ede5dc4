package analyzer

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"msmemscope/trace"
)

// Decompose per CUDA device: its tensor blocks by category, and what
// PyTorch's own tools cannot show beside them, from the HAL rows (the
// driver's blocks) and the device SNAPSHOT rows (cuMemGetInfo):
//   - requested: PTA bytes, the sizes the tensors asked for
//     (memory_stats()["requested_bytes.all.current"]; memory_allocated()
//     counts the allocator's rounded blocks);
//   - reserved: HAL blocks that are PyTorch's segments (Owner HAL@pytorch:
//     torch.cuda.memory_reserved());
//   - cached_free: reserved minus the tensor blocks that lie in those
//     segments: what the caching allocator holds for no tensor, the
//     rounding of its blocks included;
//   - outside_pytorch: the other HAL blocks (library workspaces, NCCL,
//     other libraries' cudaMalloc), and below it the sites that allocated
//     them (lines "outside_pytorch at SITE", largest peak first);
//   - context_inferred: the device's used bytes (total − free) minus every
//     driver block the rows hold, at each device SNAPSHOT: the CUDA context and whatever
//     the driver did not allocate through the API (other processes' memory
//     on a shared GPU too). Inferred: no call allocates it.

// Device line names, in the order they are reported after the categories.
var deviceLines = []string{"requested", "reserved", "cached_free", "outside_pytorch", "context_inferred"}

type devClass uint8

const (
	devNone devClass = iota
	devPTA
	devPTAInSeg  // a tensor block inside one of PyTorch's segments
	devPTADriver // a tensor block that is a driver block too (cudaMallocAsync's)
	devHAL
	devReserved // a HAL block of PyTorch's
)

type devStats struct {
	name         string
	pta, ptaDrv  uint64          // tensor blocks; those of them that are driver blocks
	inSeg        uint64          // tensor blocks inside PyTorch's segments
	hal, seg     uint64          // other HAL blocks; PyTorch's segments
	segs         []span          // where PyTorch's segments are, by start
	torchHandles map[uint64]bool // PyTorch's cuMemCreate handles (expandable segments)
	// Tensor blocks in no segment yet, by where they are: a segment's row
	// may come after its first tensor's (two clocks stamp them).
	outSeg   map[blockKey]uint64
	lines    map[string]*DecomposeStat
	cats     map[string]*DecomposeStat
	outSites map[string]*DecomposeStat // outside_pytorch by allocation site
	sawSeg   bool                      // a segment of PyTorch's was seen: reserved and cached_free have something to say
}

// DeviceDecompose is one CUDA device's lines: its categories, then
// deviceLines (lines with nothing to say are left out).
type DeviceDecompose struct {
	Device string          `json:"device"` // cuda:N
	Lines  []DecomposeStat `json:"lines"`
}

func (a *DecomposeAnalyzer) device(id string) *devStats {
	d := a.devs[id]
	if d == nil {
		d = &devStats{name: "cuda:" + id, lines: map[string]*DecomposeStat{}, cats: map[string]*DecomposeStat{},
			outSites: map[string]*DecomposeStat{}, torchHandles: map[uint64]bool{}, outSeg: map[blockKey]uint64{}}
		a.devs[id] = d
	}
	return d
}

// classOf is a device MALLOC's class; a segment of PyTorch's is noted
// where it lies (a cuMemAlloc block: its range; a cuMemCreate handle: where
// MAP rows put it).
func (a *DecomposeAnalyzer) classOf(d *devStats, e *trace.Event) devClass {
	switch e.Type {
	case trace.TypePTA:
		if _, drv := e.Get("kind"); drv { // the driver's kind: a HAL block made a tensor's
			return devPTADriver
		}
		if d.inSegment(e.Ptr) {
			return devPTAInSeg
		}
		d.outSeg[blockKey{e.Pid, e.AllocID}] = e.Ptr
		return devPTA
	case trace.TypeHAL:
		if strings.HasSuffix(e.Owner, "@pytorch") {
			if k, _ := e.Get("kind"); k == "vmm" {
				d.torchHandles[e.Ptr] = true
			} else {
				a.addSpan(d, e.Ptr, e.Size)
			}
			return devReserved
		}
		return devHAL
	}
	return devNone
}

// isDevice reports whether a row is a CUDA device's.
func isDevice(e *trace.Event) bool { return e.Device != trace.DeviceHost && e.Device != "" }

// span is an address range, [start, end).
type span struct{ start, end uint64 }

// addSpan notes a segment of PyTorch's, and counts the live tensor blocks
// in it as in it.
func (a *DecomposeAnalyzer) addSpan(d *devStats, p, n uint64) {
	i, _ := slices.BinarySearchFunc(d.segs, p, func(s span, p uint64) int { return cmp.Compare(s.start, p) })
	d.segs = slices.Insert(d.segs, i, span{p, p + n})
	for k, ptr := range d.outSeg {
		if ptr >= p && ptr < p+n {
			delete(d.outSeg, k)
			if l, ok := a.live[k]; ok {
				l.class = devPTAInSeg
				a.live[k] = l
				d.inSeg += l.size
			}
		}
	}
}

func (d *devStats) dropSpan(p uint64) {
	if i, ok := slices.BinarySearchFunc(d.segs, p, func(s span, p uint64) int { return cmp.Compare(s.start, p) }); ok {
		d.segs = slices.Delete(d.segs, i, i+1)
	}
}

func (d *devStats) inSegment(p uint64) bool {
	i, ok := slices.BinarySearchFunc(d.segs, p, func(s span, p uint64) int { return cmp.Compare(s.start, p) })
	if ok {
		return true
	}
	return i > 0 && p < d.segs[i-1].end
}

// observeMapping takes a MAP or UNMAP row: where a handle of PyTorch's
// expandable segments is mapped.
func (a *DecomposeAnalyzer) observeMapping(e *trace.Event) {
	if !isDevice(e) {
		return
	}
	d := a.device(e.Device)
	if e.Kind == trace.KindUnmap {
		d.dropSpan(e.Ptr)
		return
	}
	h, _ := e.Get("handle")
	hv, err := strconv.ParseUint(strings.TrimPrefix(h, "0x"), 16, 64)
	n, _ := e.Get("size")
	nv, err2 := strconv.ParseUint(n, 10, 64)
	if err == nil && err2 == nil && d.torchHandles[hv] {
		a.addSpan(d, e.Ptr, nv)
	}
}

// siteOf names where a block was allocated: its site, else its C stack's
// first frame.
func siteOf(e *trace.Event) string {
	if e.Site != "" {
		return e.Site
	}
	if f, _, _ := strings.Cut(e.CStack, ";"); f != "" {
		return f
	}
	return "unknown"
}

// observeDevice accounts a device block's MALLOC or FREE; site is an
// outside-PyTorch block's.
func (a *DecomposeAnalyzer) observeDevice(d *devStats, c devClass, cat, site *DecomposeStat, size uint64, malloc bool) {
	add := func(v *uint64) {
		if malloc {
			*v += size
		} else {
			*v -= min(*v, size)
		}
	}
	switch c {
	case devPTA, devPTADriver, devPTAInSeg:
		add(&d.pta)
		if c == devPTADriver {
			add(&d.ptaDrv)
		}
		if c == devPTAInSeg {
			add(&d.inSeg)
		}
		if cat != nil {
			s := stat(d.cats, cat.Name)
			if malloc {
				s.Blocks++
			}
			add(&s.live)
			s.Peak = max(s.Peak, s.live)
		}
	case devReserved:
		d.sawSeg = true
		add(&d.seg)
		// (A freed segment's span goes with its FREE: Observe has the row.)
	case devHAL:
		add(&d.hal)
		if site != nil {
			if malloc {
				site.Blocks++
			}
			add(&site.live)
			site.Peak = max(site.Peak, site.live)
		}
	}
	d.set("requested", d.pta)
	if d.sawSeg {
		d.set("reserved", d.seg)
		d.set("cached_free", d.seg-min(d.seg, d.inSeg))
	}
	d.set("outside_pytorch", d.hal)
}

func (d *devStats) set(line string, v uint64) {
	s := stat(d.lines, line)
	s.live = v
	s.Peak = max(s.Peak, v)
}

// observeSnapshot takes a device SNAPSHOT row's used bytes.
func (a *DecomposeAnalyzer) observeSnapshot(e *trace.Event) {
	if !isDevice(e) {
		return
	}
	v, ok := e.Get("used")
	if !ok {
		return
	}
	used, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return
	}
	d := a.device(e.Device)
	drv := d.hal + d.seg + d.ptaDrv // every driver block the rows hold
	d.set("context_inferred", used-min(used, drv))
}

func (a *DecomposeAnalyzer) finishDevices() []DeviceDecompose {
	var out []DeviceDecompose
	ids := make([]string, 0, len(a.devs))
	for id := range a.devs {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(x, y string) int { // by ordinal
		return cmp.Or(cmp.Compare(len(x), len(y)), strings.Compare(x, y))
	})
	for _, id := range ids {
		d := a.devs[id]
		dd := DeviceDecompose{Device: d.name}
		for _, c := range TorchCategories {
			if s := d.cats[c]; s != nil {
				s.End = s.live
				dd.Lines = append(dd.Lines, *s)
			}
		}
		for _, n := range deviceLines {
			if s := d.lines[n]; s != nil {
				s.End = s.live
				dd.Lines = append(dd.Lines, *s)
			}
			if n == "outside_pytorch" {
				for _, s := range sorted(d.outSites) {
					s.Name = "outside_pytorch at " + s.Name
					dd.Lines = append(dd.Lines, s)
				}
			}
		}
		out = append(out, dd)
	}
	return out
}

func (dd DeviceDecompose) summary() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "  %s:\n", dd.Device)
	for _, s := range dd.Lines {
		fmt.Fprintf(&sb, "    %-16s peak %12d  end %12d\n", s.Name, s.Peak, s.End)
	}
	return sb.String()
}
