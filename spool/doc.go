// Package spool reads a capture back. It is where a recorded event becomes a
// dump row:
//
//   - spool.go: the spool file (header, per-thread chunks, full, compact and
//     pair records) read in time order across threads (Reader); the record
//     kinds, flags and layouts are package format's (format/records.def);
//     pycode.go reads the Python side's code objects;
//   - decode.go: what each record means (Decoder): rows numbered, FREEs
//     paired with their MALLOCs, shadow MALLOCs, mstx ranges, steps, stacks
//     and sites symbolized; torch.go: the PyTorch records;
//   - logs.go, logspool.go: rotated logs, alone or read in place as one spool;
//   - layout.go: the capture folder, process.json, end.json, run manifests;
//   - open.go: Find and Open, which take any input a user names (an output
//     folder, a capture folder, a spool or log file, a dump CSV or DB) and
//     give one trace.Input.
//
// The writing side (the capture folder's creation, rotation) is package
// capture's, the conversion to the dump package collect's; the event model
// and the dump formats are package trace's.
package spool
