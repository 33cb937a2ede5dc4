package spool

// PyTorch records (hook.h R_OP_START..R_TAG), written by the Python package's
// dispatch mode (python/msmemscope/torch_hooks.py) through
// msmemscope_torch_event. Payloads are text; torch.go gives them their meaning.
const (
	ROpStart  = 40 // a = launch index; text: operator name, then READ access lines
	ROpEnd    = 41 // a = launch index; text: operator name, then WRITE access lines
	RSnapshot = 42 // text: "k:v,k:v"
	RWatch    = 43 // a = launch index; text: a watch result line
	RTag      = 44 // a = storage address; text: owner category
)
