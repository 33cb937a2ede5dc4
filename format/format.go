// Package format is the spool's record format as Go constants, generated from
// records.def, the one table that the C hook (libmemscope/records_gen.h), the
// Go reader (spool, capture) and the Python package (msmemscope/_records.py)
// share. Edit records.def and run `make generate`.
package format

//go:generate go run ./gen
