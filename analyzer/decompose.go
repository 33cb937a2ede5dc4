package analyzer

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"msmemscope/trace"
)

// Decompose (SPEC §5.5): live bytes per owner over a stream of events, with
// each owner's peak and the bytes still live at the end. Owners are the
// MALLOC rows' owner attr ("PTA@model@weight"); a category groups owners by
// what the memory is: the PyTorch categories (weight, gradient,
// optimizer_state, activation, aten) wherever they appear in the owner, else
// the owner's framework (PTA, HOST, HOST@mmap).

// TorchCategories are the PyTorch owner categories, most specific first.
var TorchCategories = []string{"weight", "gradient", "optimizer_state", "activation", "aten"}

// DecomposeStat is one owner's (or category's) figures.
type DecomposeStat struct {
	Name   string `json:"name"`
	Peak   uint64 `json:"peak_bytes"`
	End    uint64 `json:"end_bytes"`
	Blocks uint64 `json:"blocks"` // MALLOCs
	live   uint64
}

// DecomposeReport is the decompose summary.
type DecomposeReport struct {
	Categories []DecomposeStat   `json:"categories"` // largest peak first
	Owners     []DecomposeStat   `json:"owners"`
	Devices    []DeviceDecompose `json:"devices,omitempty"` // CUDA devices (decompose_device.go)
}

type decLive struct {
	owner, cat *DecomposeStat
	size       uint64
	dev        *devStats // a CUDA device's block
	class      devClass
	site       *DecomposeStat // an outside-PyTorch block's site
}

// DecomposeAnalyzer accumulates a DecomposeReport; memory grows with live blocks.
type DecomposeAnalyzer struct {
	live   map[blockKey]decLive
	owners map[string]*DecomposeStat
	cats   map[string]*DecomposeStat
	devs   map[string]*devStats // by Device Id
}

// NewDecomposeAnalyzer returns an empty analyzer.
func NewDecomposeAnalyzer() *DecomposeAnalyzer {
	return &DecomposeAnalyzer{live: map[blockKey]decLive{}, owners: map[string]*DecomposeStat{}, cats: map[string]*DecomposeStat{},
		devs: map[string]*devStats{}}
}

// Category names the category of an owner.
func Category(owner string) string {
	parts := strings.Split(owner, "@")
	for i := len(parts) - 1; i >= 1; i-- {
		if slices.Contains(TorchCategories, parts[i]) {
			return parts[i]
		}
	}
	if parts[0] == "HOST" && len(parts) > 1 && parts[1] == "mmap" {
		return "HOST@mmap"
	}
	return parts[0]
}

func stat(m map[string]*DecomposeStat, k string) *DecomposeStat {
	s := m[k]
	if s == nil {
		s = &DecomposeStat{Name: k}
		m[k] = s
	}
	return s
}

// Observe takes the next event.
func (a *DecomposeAnalyzer) Observe(e *trace.Event) {
	switch e.Kind {
	case trace.KindMalloc:
		key := blockKey{e.Pid, e.AllocID}
		if old, ok := a.live[key]; ok {
			old.owner.live -= old.size
			old.cat.live -= old.size
			if old.dev != nil {
				a.observeDevice(old.dev, old.class, old.cat, old.site, old.size, false)
				delete(old.dev.outSeg, key)
			}
		}
		owner := e.Owner
		if owner == "" {
			owner = e.Type
		}
		l := decLive{owner: stat(a.owners, owner), cat: stat(a.cats, Category(owner)), size: e.Size}
		for _, s := range []*DecomposeStat{l.owner, l.cat} {
			s.Blocks++
			s.live += e.Size
			s.Peak = max(s.Peak, s.live)
		}
		if isDevice(e) {
			l.dev = a.device(e.Device)
			l.class = a.classOf(l.dev, e)
			if l.class == devHAL {
				l.site = stat(l.dev.outSites, siteOf(e))
			}
			a.observeDevice(l.dev, l.class, l.cat, l.site, e.Size, true)
		}
		a.live[key] = l
	case trace.KindFree:
		key := blockKey{e.Pid, e.AllocID}
		if l, ok := a.live[key]; ok {
			l.owner.live -= l.size
			l.cat.live -= l.size
			if l.dev != nil {
				a.observeDevice(l.dev, l.class, l.cat, l.site, l.size, false)
				switch l.class {
				case devReserved:
					l.dev.dropSpan(e.Ptr) // (a handle's spans go with its UNMAP rows)
					delete(l.dev.torchHandles, e.Ptr)
				case devPTA:
					delete(l.dev.outSeg, key)
				}
			}
			delete(a.live, key)
		}
	case trace.KindMap, trace.KindUnmap:
		a.observeMapping(e)
	case trace.KindSnapshot:
		a.observeSnapshot(e)
	}
}

func sorted(m map[string]*DecomposeStat) []DecomposeStat {
	out := make([]DecomposeStat, 0, len(m))
	for _, s := range m {
		s.End = s.live
		out = append(out, *s)
	}
	slices.SortFunc(out, func(x, y DecomposeStat) int {
		if c := cmp.Compare(y.Peak, x.Peak); c != 0 {
			return c
		}
		return strings.Compare(x.Name, y.Name)
	})
	return out
}

// Finish returns the report (end bytes: still live after the last event).
func (a *DecomposeAnalyzer) Finish() *DecomposeReport {
	return &DecomposeReport{Categories: sorted(a.cats), Owners: sorted(a.owners), Devices: a.finishDevices()}
}

// Category returns the figures of one category (zero when absent).
func (r *DecomposeReport) Category(name string) DecomposeStat {
	for _, s := range r.Categories {
		if s.Name == name {
			return s
		}
	}
	return DecomposeStat{Name: name}
}

// WriteCSV writes the report: Kind (category, owner, or a CUDA device's
// cuda:N), Name, Peak(byte), End(byte), Allocations.
func (r *DecomposeReport) WriteCSV(w io.Writer) error {
	var b []byte
	b = append(b, "Kind,Name,Peak(byte),End(byte),Allocations\n"...)
	for _, part := range []struct {
		kind  string
		stats []DecomposeStat
	}{{"category", r.Categories}, {"owner", r.Owners}} {
		for _, s := range part.stats {
			b = appendDecomposeLine(b, part.kind, s)
		}
	}
	for _, d := range r.Devices {
		for _, s := range d.Lines {
			b = appendDecomposeLine(b, d.Device, s)
		}
	}
	_, err := w.Write(b)
	return err
}

func appendDecomposeLine(b []byte, kind string, s DecomposeStat) []byte {
	b = append(b, kind...)
	b = append(b, ',')
	if strings.ContainsAny(s.Name, ",\"\r\n") { // a site: C++ names hold commas
		b = append(b, '"')
		b = append(b, strings.ReplaceAll(s.Name, `"`, `""`)...)
		b = append(b, '"')
	} else {
		b = append(b, s.Name...)
	}
	b = append(b, ',')
	b = strconv.AppendUint(b, s.Peak, 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, s.End, 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, s.Blocks, 10)
	return append(b, '\n')
}

// decomposeOwnersShown is how many owners the console lists.
const decomposeOwnersShown = 10

// Summary is the console report: one line per category, then the owners
// within them.
func (r *DecomposeReport) Summary() string {
	var sb strings.Builder
	sb.WriteString("decompose (peak / end bytes per owner):\n")
	if len(r.Categories) == 0 && len(r.Devices) == 0 {
		sb.WriteString("  none: no block was recorded\n")
	}
	cats := map[string]bool{}
	for _, s := range r.Categories {
		cats[s.Name] = true
		fmt.Fprintf(&sb, "  %-16s peak %12d  end %12d  (%d allocations)\n", s.Name, s.Peak, s.End, s.Blocks)
	}
	// The owners within them (describe() tags, PyTorch's roles), largest
	// first, as many as fit a glance: the CSV has every one.
	var owners []DecomposeStat
	for _, s := range r.Owners {
		if !cats[s.Name] {
			owners = append(owners, s)
		}
	}
	for i, s := range owners {
		if i == decomposeOwnersShown {
			fmt.Fprintf(&sb, "    … %d owners more in the decompose CSV\n", len(owners)-i)
			break
		}
		fmt.Fprintf(&sb, "    %-14s peak %12d  end %12d  (%d allocations)\n", s.Name, s.Peak, s.End, s.Blocks)
	}
	for _, d := range r.Devices {
		sb.WriteString(d.summary())
	}
	return sb.String()
}
