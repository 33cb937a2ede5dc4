package capture

import (
	"msmemscope/config"
	"msmemscope/trace"
)

// What package collect (the conversion) uses of the spool's decoder while
// it lives here: thin exports of unexported pieces, nothing more.

// OpenCaptureSpool opens a capture folder's spool (spool.bin, or its
// rotated logs combined); it can be read any number of times.
func OpenCaptureSpool(dir string) (*trace.Spool, error) { return openCaptureSpool(dir) }

// ReadEnd reads end.json; nil when the image did not end normally.
func ReadEnd(dir string) *EndMeta { return readEnd(dir) }

// WriteJSON writes v indented into a new file.
func WriteJSON(path string, v any) error { return writeJSON(path, v) }

// TorchInfo is what a first pass over a spool with PyTorch records learnt:
// which blocks are tensor storages, and their owners.
type TorchInfo struct{ t *torchDec }

// TorchPrepass learns it (see torch.go).
func TorchPrepass(sp *trace.Spool, dir string, meta *ProcessMeta, cfg config.Config) (*TorchInfo, error) {
	t, err := torchPrepass(sp, dir, meta, cfg)
	if err != nil {
		return nil, err
	}
	return &TorchInfo{t}, nil
}

// Decoder turns a spool's records into dump events, numbered as in the
// dump: every Decoder of one spool gives the same rows.
type Decoder struct{ d *decoder }

// NewDecoder decodes sp from its start. mapsFile symbolizes C stacks (see
// Options.MapsFile); fast leaves stacks, sites and attrs out (a pass that
// only judges rows); torch is what TorchPrepass learnt (nil: no PyTorch records).
func NewDecoder(sp *trace.Spool, dir string, meta *ProcessMeta, cfg config.Config, mapsFile string, fast bool, torch *TorchInfo) *Decoder {
	d := newDecoder(sp, dir, meta, cfg)
	d.mapsFile = mapsFile
	d.fast = fast
	d.torch = newTorchDec(cfg, false)
	if torch != nil {
		d.torch.pta, d.torch.cat, d.torch.tag = torch.t.pta, torch.t.cat, torch.t.tag
	}
	return &Decoder{d}
}

// Next returns the next event, nil at the end.
func (d *Decoder) Next() (*trace.Event, error) { return d.d.next() }

// Records counts the spool records read.
func (d *Decoder) Records() uint64 { return d.d.records }

// Lost counts the events the spool says were lost.
func (d *Decoder) Lost() uint64 { return d.d.lost }

// Exec is the program the image exec'd into, if any.
func (d *Decoder) Exec() string { return d.d.exec }

// Forks lists the children the image forked.
func (d *Decoder) Forks() []int { return d.d.forks }

// Watch lists the watch findings (SPEC §5.4).
func (d *Decoder) Watch() []WatchFinding { return d.d.torch.watch }

// Holds reports whether sp, decoded, can hold rows of kind k: operator
// launches and ACCESS rows come only from PyTorch records.
func Holds(sp *trace.Spool, k trace.Kind) bool {
	switch k {
	case trace.KindOpLaunch, trace.KindAccess:
		return sp.HasTorch
	}
	return true
}
