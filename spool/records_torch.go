package spool

import "msmemscope/format"

// PyTorch records (R_OP_START..R_TAG in format/records.def), written by the
// Python package's dispatch mode (python/msmemscope/torch_hooks.py) through
// msmemscope_torch_event. Payloads are text; torch.go gives them their meaning.
const (
	ROpStart  = format.ROpStart  // a = launch index; text: operator name, then READ access lines
	ROpEnd    = format.ROpEnd    // a = launch index; text: operator name, then WRITE access lines
	RSnapshot = format.RSnapshot // text: "k:v,k:v"
	RWatch    = format.RWatch    // a = launch index; text: a watch result line
	RTag      = format.RTag      // a = storage address; text: owner category
)
