package spool

import (
	"strconv"
	"strings"

	"msmemscope/config"
	"msmemscope/format"
	"msmemscope/trace"
)

// PyTorch records (format.ROpStart..RTag) become OP_LAUNCH, ACCESS and SNAPSHOT
// rows, and turn HOST blocks into PTA blocks with owners (SPEC §2.1, §4.2,
// §5.5). Owners and PTA-ness are often learnt after a block's MALLOC (a
// parameter is tagged when the optimizer steps), so a capture holding
// PyTorch records is decoded twice: a first pass (pre) learns, by
// allocation id, which blocks are tensor storages and what owns them; the
// pass that writes the rows applies it. Decoding is deterministic, so both
// passes give a block the same allocation id.
//
// Payloads, written by python/msmemscope/torch_hooks.py:
//   - ROpStart / ROpEnd: the operator name, then one line per tensor
//     argument: "R|W|N storage_hex data_hex nbytes dtype shape format"
//     (READ lines on the start, WRITE lines on the end; without access
//     events every line is "N storage_hex 0 0 - [] -": the storage alone);
//   - RTag: a category (weight, gradient, optimizer_state, activation) for
//     the storage at a;
//   - RSnapshot: "k:v,k:v";
//   - RWatch: "changed|unchanged|watch tensor hash_before hash_after".

// owner categories, by rank: a block keeps the highest it was given.
var catRank = map[string]uint8{"aten": 1, "activation": 2, "optimizer_state": 3, "gradient": 4, "weight": 5}
var catName = [...]string{"", "aten", "activation", "optimizer_state", "gradient", "weight"}

type torchDec struct {
	pre    bool
	launch bool
	access bool
	depth  map[int32]int // operators open per thread
	open   int           // operators open in all threads (a CUDA tensor block's thread is not known)

	// CUDA tensor blocks allocated, by their history's time, while no
	// operator was open, lately (within opSkew of the last): the first pass
	// offers them to the operator that starts next (early, on thread
	// earlyTid), which owns one it or an operator it calls outputs, unless
	// it read it first.
	lately   []struct{ id, ns uint64 }
	early    map[uint64]bool // allocation ids
	earlyTid int32

	// Learnt by the first pass, by allocation id.
	pta map[uint64]bool
	cat map[uint64]uint8
	tag map[uint64]string // describe(obj, owner=)
	seg map[uint64]bool   // HAL blocks that are PyTorch's segments (cudahist.go)

	// The first pass's view of PyTorch's segments (cudahist.go).
	segAt     map[uint64]bool   // segment addresses whose HAL MALLOC is still to come
	segRanges [][2]uint64       // ranges PyTorch mapped (expandable segments)
	maps      map[uint64]uint64 // virtual address -> the handle block mapped there

	// The writing pass.
	used      map[string]uint64 // live PTA bytes per device
	launchRow map[uint64]uint64 // launch index -> its ATEN_START row ID
	launchOp  map[uint64]string
	watch     []WatchFinding
}

// WatchFinding is one line of the watch report (SPEC §5.4).
type WatchFinding struct {
	Launch   uint64 // launch index (ATEN_START count, from 1)
	Row      uint64 // the ATEN_START row of that launch (0: not written)
	Operator string
	Status   string // watch (first hash), changed, unchanged (at end)
	Tensor   string
	Before   string
	After    string
}

func newTorchDec(cfg config.Config, pre bool) *torchDec {
	return &torchDec{pre: pre, launch: cfg.Events.Launch, access: cfg.Events.Access, depth: map[int32]int{},
		pta: map[uint64]bool{}, cat: map[uint64]uint8{}, tag: map[uint64]string{}, seg: map[uint64]bool{},
		segAt: map[uint64]bool{}, maps: map[uint64]uint64{}, used: map[string]uint64{},
		launchRow: map[uint64]uint64{}, launchOp: map[uint64]string{}}
}

// torchPrepass decodes the spool once to learn tensor blocks and owners.
func torchPrepass(sp *Spool, dir string, meta *ProcessMeta, cfg config.Config) (*torchDec, error) {
	d := NewDecoder(sp, dir, meta, cfg)
	d.fast = true
	d.torch = newTorchDec(cfg, true)
	if err := trace.Each(d, func(*trace.Event) error { return nil }); err != nil {
		return nil, err
	}
	t := newTorchDec(cfg, false)
	t.pta, t.cat, t.tag, t.seg = d.torch.pta, d.torch.cat, d.torch.tag, d.torch.seg
	return t, nil
}

// lookup finds the live block at a storage address: a host block, a CUDA
// tensor block of PyTorch's allocator history, or the driver's block of an
// async allocation (cudaMallocAsync's: one a tensor).
func (d *Decoder) lookupBlock(addr uint64) *block {
	if addr == 0 {
		return nil
	}
	if b := d.live.Ptr(uint64(MakeKey(format.FHost, addr))); b != nil && !b.own {
		return b
	}
	if len(d.hist) > 0 {
		if b := d.live.Ptr(uint64(MakeKey(subTensor, addr))); b != nil {
			return b
		}
	}
	if b := d.live.Ptr(uint64(MakeKey(format.FHal, addr))); b != nil && b.async {
		return b
	}
	return nil
}

// torchRecord handles a PyTorch record: the first row it makes is returned,
// the others wait in d.pending.
func (d *Decoder) torchRecord(r *Rec, e *trace.Event) *trace.Event {
	t := d.torch
	if t == nil {
		return nil
	}
	switch r.Kind {
	case format.ROpStart, format.ROpEnd:
		text := r.Text()
		name, lines, _ := strings.Cut(text, "\n")
		if r.Kind == format.ROpStart {
			if t.pre && t.open == 0 {
				t.offerLately(e.Timestamp, r.Tid)
			}
			t.depth[r.Tid]++
			t.open++
		} else if t.depth[r.Tid] > 0 {
			t.depth[r.Tid]--
			t.open--
		}
		var rows []*trace.Event
		if r.Kind == format.ROpStart && t.launch {
			rows = append(rows, &trace.Event{Kind: trace.KindOpLaunch, Type: trace.TypeAtenStart, Name: name,
				Timestamp: e.Timestamp, Tid: e.Tid, Device: trace.DeviceHost})
		}
		for lines != "" {
			var ln string
			ln, lines, _ = strings.Cut(lines, "\n")
			f := strings.Fields(ln)
			if len(f) < 7 {
				continue
			}
			sptr, _ := strconv.ParseUint(f[1], 16, 64)
			b := d.lookupBlock(sptr)
			if t.pre {
				if b != nil {
					t.pta[b.id] = true
					if len(t.early) > 0 && r.Tid == t.earlyTid && t.early[b.id] {
						delete(t.early, b.id) // an input (R, at the start) was not made here
						if r.Kind == format.ROpEnd && t.cat[b.id] == 0 {
							t.cat[b.id] = catRank["aten"]
						}
					}
				}
				continue
			}
			if !t.access || f[0] == "N" { // N: a block seen, not accessed (aten::empty's output)
				continue
			}
			a := &trace.Event{Kind: trace.KindAccess, Type: trace.TypeRead, Name: name, Timestamp: e.Timestamp,
				Tid: e.Tid, Device: trace.DeviceHost}
			if f[0] == "W" {
				a.Type = trace.TypeWrite
			}
			if b != nil {
				a.AllocID = b.id
			}
			rows = append(rows, a)
			if d.fast {
				continue // a pass that only judges rows: no attrs
			}
			if p, err := strconv.ParseUint(f[2], 16, 64); err == nil && p != 0 {
				a.Ptr, a.HasPtr = p, true
			}
			a.Size, _ = strconv.ParseUint(f[3], 10, 64)
			a.Extra = []trace.KV{{Key: "dtype", Value: f[4]}, {Key: "shape", Value: f[5]}, {Key: "size", Value: f[3]},
				{Key: "format", Value: f[6]}, {Key: "type", Value: trace.TypePTA}}
			if b != nil {
				a.Extra = append(a.Extra, trace.KV{Key: "allocation_id", Value: strconv.FormatUint(b.id, 10)})
			}
		}
		if t.pre && r.Kind == format.ROpEnd && r.Tid == t.earlyTid && t.depth[r.Tid] == 0 {
			clear(t.early) // the offered operator has ended
		}
		if r.Kind == format.ROpEnd && t.launch {
			rows = append(rows, &trace.Event{Kind: trace.KindOpLaunch, Type: trace.TypeAtenEnd, Name: name,
				Timestamp: e.Timestamp, Tid: e.Tid, Device: trace.DeviceHost})
		}
		if r.Kind == format.ROpStart && !t.pre && !d.fast { // for the watch report
			t.launchOp[r.A] = name
			if len(rows) > 0 && rows[0].Kind == trace.KindOpLaunch {
				rows[0].MstxID = r.A // for the watch report (not written: only MSTX rows show it)
			}
		}
		if len(rows) == 0 {
			return nil
		}
		d.pending = append(d.pending, rows[1:]...)
		return rows[0]
	case format.RConfig: // msmemscope.config(): the rows from now on as it asks (FollowConfig)
		if d.follow && !t.pre {
			if c, err := config.Decode(r.Text()); err == nil {
				t.launch, t.access = c.Events.Launch, c.Events.Access
			}
		}
	case format.RTag:
		if b := d.lookupBlock(r.A); b != nil && t.pre {
			t.pta[b.id] = true
			if k := catRank[r.Text()]; k > t.cat[b.id] {
				t.cat[b.id] = k
			}
		}
	case format.RDescribe:
		if b := d.lookupBlock(r.A); b != nil && t.pre {
			t.tag[b.id] = trace.CleanAttrValue(strings.ReplaceAll(r.Text(), "@", "_"))
		}
	case format.RWatch:
		if t.pre {
			return nil
		}
		f := strings.Fields(r.Text())
		if len(f) >= 4 {
			t.watch = append(t.watch, WatchFinding{Launch: r.A, Row: t.launchRow[r.A], Operator: t.launchOp[r.A],
				Status: f[0], Tensor: f[1], Before: f[2], After: f[3]})
		}
	}
	return nil
}

// torchEmitted sees every row as it is numbered: it learns (first pass) or
// applies (writing pass) what makes a block a PTA block and its owner.
func (d *Decoder) torchEmitted(e *trace.Event) {
	t := d.torch
	switch e.Kind {
	case trace.KindOpLaunch:
		if !t.pre && e.Type == trace.TypeAtenStart && e.MstxID != 0 {
			if !d.fast {
				t.launchRow[e.MstxID] = e.ID
			}
			e.MstxID = 0
		}
	case trace.KindMalloc:
		if t.pre {
			inOp := t.depth[int32(e.Tid)] > 0
			switch e.Type {
			case trace.TypePTA: // a CUDA tensor block (cudahist.go)
				t.pta[e.AllocID] = true
				inOp = t.open > 0
				if !inOp {
					t.noteLately(e.AllocID, e.Timestamp)
				}
			case trace.TypeHAL:
				t.halMalloc(e)
			}
			if inOp && t.cat[e.AllocID] == 0 {
				t.cat[e.AllocID] = catRank["aten"]
			}
			return
		}
		if t.seg[e.AllocID] {
			e.Owner = "HAL@pytorch"
			return
		}
		if len(t.tag) == 0 && len(t.pta) == 0 {
			return // no PyTorch records
		}
		tag := t.tag[e.AllocID]
		if !t.pta[e.AllocID] {
			if tag != "" && e.Type == trace.TypeHost {
				e.Owner = "HOST@" + tag
			}
			return
		}
		e.Type = trace.TypePTA
		owner := "PTA"
		if _, scope, ok := strings.Cut(e.Owner, "@"); ok && e.Owner != "HOST@mmap" {
			owner += "@" + scope // a describe scope
		}
		if tag != "" {
			owner += "@" + tag
		}
		if c := t.cat[e.AllocID]; c != 0 {
			owner += "@" + catName[c]
		}
		e.Owner = owner
		used := t.used[e.Device] + e.Size
		t.used[e.Device] = used
		if !d.fast {
			e.Set("total", strconv.FormatUint(used, 10))
			e.Set("used", strconv.FormatUint(used, 10))
		}
	case trace.KindFree:
		if t.pre || !t.pta[e.AllocID] {
			return
		}
		e.Type = trace.TypePTA
		used := t.used[e.Device] - min(t.used[e.Device], e.Size)
		t.used[e.Device] = used
		if !d.fast {
			e.Set("total", strconv.FormatUint(used, 10))
			e.Set("used", strconv.FormatUint(used, 10))
		}
	}
}

// opSkew is how far, in the records' time, a CUDA tensor block's alloc
// entry may come before the operator that allocated it: the history's
// clock and the records' are the two histWait allows for, and an
// operator's output is allocated microseconds after it starts.
const opSkew = histWait

// noteLately keeps a CUDA tensor block allocated outside every operator
// until opSkew has passed.
func (t *torchDec) noteLately(id, ns uint64) {
	i := 0 // (rows come in time order)
	for i < len(t.lately) && t.lately[i].ns+opSkew < ns {
		i++
	}
	t.lately = append(t.lately[i:], struct{ id, ns uint64 }{id, ns})
}

// offerLately, at an outermost operator's start (at ns, on thread tid),
// offers it the blocks allocated within opSkew before: one it or an
// operator it calls names as an output (a W or N line at its end) was
// allocated inside it, unless it was an input first (an R line at a start:
// an in-place write of a block made outside every operator).
func (t *torchDec) offerLately(ns uint64, tid int32) {
	clear(t.early)
	t.earlyTid = tid
	if len(t.lately) == 0 {
		return
	}
	if t.early == nil {
		t.early = map[uint64]bool{}
	}
	for _, l := range t.lately {
		if l.ns+opSkew >= ns {
			t.early[l.id] = true
		}
	}
	t.lately = t.lately[:0]
}
