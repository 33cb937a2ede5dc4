package collect

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"msmemscope/analyzer"
	"msmemscope/internal/safefs"
	"msmemscope/spool"
	"msmemscope/trace"
)

// An OOM row (a CUDA allocation the driver refused) is followed, in the
// analysis folder, by what was live on that device at that moment, per
// site: the shape of get_mem_report, so that the answer to "why did it run
// out" is the report a user already reads.

// OOMFinding is one refused allocation and its device's memory then.
type OOMFinding struct {
	Row         uint64             `json:"row"` // the OOM row's ID in the dump
	TimestampNs uint64             `json:"timestamp_ns"`
	Device      string             `json:"device"`
	Kind        string             `json:"kind"` // device, managed, vmm, pinned memory
	Requested   uint64             `json:"requested"`
	Stack       string             `json:"call_stack,omitempty"`
	Live        analyzer.MemReport `json:"live"` // total_size, mem_report: the device's live blocks by site
}

// oomWatch keeps each device's live CUDA blocks as the rows go by.
type oomWatch struct {
	live     map[string]*analyzer.LiveSet // by Device Id
	findings []OOMFinding
}

func (o *oomWatch) observe(e *trace.Event) {
	switch {
	case e.IsMemory() && (e.Type == trace.TypeHAL || e.Type == trace.TypeHostPinned):
		if o.live == nil {
			o.live = map[string]*analyzer.LiveSet{}
		}
		l := o.live[e.Device]
		if l == nil {
			l = analyzer.NewLiveSet()
			o.live[e.Device] = l
		}
		l.Observe(e)
	case e.Kind == trace.KindOOM:
		f := OOMFinding{Row: e.ID, TimestampNs: e.Timestamp, Device: e.Device, Requested: e.Size, Stack: e.CStack,
			Live: analyzer.MemReport{Report: []analyzer.SiteSize{}}}
		f.Kind, _ = e.Get("kind")
		if f.Kind == "" {
			f.Kind = "pinned"
		}
		if l := o.live[e.Device]; l != nil {
			f.Live = l.Report()
		}
		o.findings = append(o.findings, f)
	}
}

// write puts the findings in analysis/oom_report_{stamp}.json and says
// them on the console, the largest live sites first.
func (o *oomWatch) write(res *Result, stamp string, console io.Writer) error {
	if len(o.findings) == 0 {
		return nil
	}
	dir := filepath.Join(res.Dir, spool.AnalysisDir)
	if err := safefs.EnsureDir(dir); err != nil {
		return err
	}
	res.OOMPath = uniquePath(filepath.Join(dir, "oom_report_"+stamp), ".json")
	if err := safefs.WriteJSON(res.OOMPath, o.findings); err != nil {
		return err
	}
	if console == nil {
		return nil
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "msmemscope: process %d (%s): %d CUDA allocation(s) refused for want of memory (%s)\n",
		res.Meta.Pid, res.Meta.ProgName(), len(o.findings), res.OOMPath)
	for _, f := range o.findings {
		fmt.Fprintf(&sb, "  row %d: %s asked on device %s (%s memory); %s live there then\n", f.Row,
			safefs.HumanBytes(f.Requested), f.Device, f.Kind, safefs.HumanBytes(f.Live.TotalSize))
		for i, s := range f.Live.Report {
			if i == ConsoleTop {
				fmt.Fprintf(&sb, "    ... and %d more site(s)\n", len(f.Live.Report)-i)
				break
			}
			site := s.Site
			if s.Function != "" {
				site = s.Function + " " + site
			}
			fmt.Fprintf(&sb, "    %10s in %d block(s)  %s\n", safefs.HumanBytes(s.Size), s.Count, site)
		}
	}
	_, err := io.WriteString(console, sb.String())
	return err
}
