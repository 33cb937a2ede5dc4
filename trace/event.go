// Package trace holds msmemscope's event model and the dump formats: the
// memscope_dump CSV (SPEC §2.1) and SQLite (§2.2), read by Open and written
// by CSVWriter and SQLiteWriter. The binary spool a run writes is package
// spool's, which decodes it into the same Event values: the analyses never
// care where events came from.
package trace

import (
	"errors"
	"strings"
)

// Kind is the "Event" column of a dump row.
type Kind uint8

const (
	KindSystem Kind = iota + 1
	KindMalloc
	KindFree
	KindAccess
	KindOpLaunch
	KindKernelLaunch
	KindMstx
	KindSnapshot
	KindOOM
	KindMap   // a CUDA VMM mapping (cuMemMap): no bytes of its own, its handle's MALLOC has them
	KindUnmap // cuMemUnmap
)

var kindNames = [...]string{
	KindSystem:       "SYSTEM",
	KindMalloc:       "MALLOC",
	KindFree:         "FREE",
	KindAccess:       "ACCESS",
	KindOpLaunch:     "OP_LAUNCH",
	KindKernelLaunch: "KERNEL_LAUNCH",
	KindMstx:         "MSTX",
	KindSnapshot:     "SNAPSHOT",
	KindOOM:          "OOM",
	KindMap:          "MAP",
	KindUnmap:        "UNMAP",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "UNKNOWN"
}

// ParseKind maps an "Event" column value back to its Kind (0 when unknown).
func ParseKind(s string) Kind {
	for k, n := range kindNames {
		if n != "" && n == s {
			return Kind(k)
		}
	}
	return 0
}

// Event types used by more than one package (the "Event Type" column).
const (
	TypeStart       = "START"
	TypeStop        = "STOP"
	TypeProcessExit = "PROCESS_EXIT"
	TypeStep        = "STEP" // msmemscope.step() / msmemscope_step(): a step boundary
	TypeHost        = "HOST"
	TypeMmap        = "MMAP"
	TypePTA         = "PTA"
	TypeHAL         = "HAL"         // CUDA driver blocks: device, managed and VMM memory
	TypeHostPinned  = "HOST_PINNED" // CUDA pinned host memory
	TypeKernel      = "KERNEL_LAUNCH"
	TypeMark        = "Mark"
	TypeRangeStart  = "Range_start"
	TypeRangeEnd    = "Range_end"
	TypeAtenStart   = "ATEN_START" // PyTorch rows: operator launches and tensor accesses
	TypeAtenEnd     = "ATEN_END"
	TypeRead        = "READ"
	TypeWrite       = "WRITE"
)

// MemoryTypes are the Event Types a MALLOC row can have.
var MemoryTypes = []string{TypeHost, TypeMmap, TypePTA, TypeHAL, TypeHostPinned}

// StepRangeMessage is the mstx range message that delimits a step (SPEC §3).
const StepRangeMessage = "step start"

// NA is written for a column that does not apply.
const NA = "N/A"

// DeviceHost is the Device Id of host-heap events.
const DeviceHost = "host"

// Event is one row of a dump. Memory events keep their Attr fields typed
// (AllocID, Addr, Size, Owner…) because every analysis reads them; anything
// else lives in Extra, in the order it was written.
type Event struct {
	ID        uint64 // 1-based position in the merged, time-ordered stream
	Kind      Kind
	Type      string // Event Type column
	Name      string // operator name, mstx message, or "" for N/A
	Timestamp uint64 // CLOCK_MONOTONIC ns
	Pid       int64
	Tid       int64
	Device    string // "host", a CUDA ordinal, or "" for N/A
	Ptr       uint64 // 0 with HasPtr false is N/A
	HasPtr    bool

	// Memory events (MALLOC, FREE; ACCESS uses AllocID and Size).
	AllocID     uint64
	Size        uint64
	Owner       string // MALLOC: "HOST", "PTA@model@weight", …
	Inefficient string // MALLOC: inefficiency types joined by '|'
	Shadow      bool   // a synthetic MALLOC for a block allocated while collection was off

	// MSTX: the range or mark id.
	MstxID uint64

	// Step is the step the event belongs to (0 before the first step). Readers
	// fill it in; it is not a column.
	Step int

	// Site is the allocation site of a MALLOC even without stacks (the
	// allocator's caller as a C frame); not a column.
	Site string

	Extra   []KV   // other Attr pairs, in file order
	PyStack string // "" is N/A
	CStack  string // "" is N/A
}

// KV is one key:value pair of the Attr column.
type KV struct{ Key, Value string }

// Get returns the value of an Extra attribute.
func (e *Event) Get(key string) (string, bool) {
	for _, kv := range e.Extra {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return "", false
}

// Set adds or replaces an Extra attribute.
func (e *Event) Set(key, value string) {
	for i := range e.Extra {
		if e.Extra[i].Key == key {
			e.Extra[i].Value = value
			return
		}
	}
	e.Extra = append(e.Extra, KV{key, value})
}

// IsMemory reports whether the event allocates or frees a block.
func (e *Event) IsMemory() bool { return e.Kind == KindMalloc || e.Kind == KindFree }

// AppendAttr appends the Attr column ("{k:v,k:v}") to b. The typed fields come
// first in a fixed order, then Extra.
func (e *Event) AppendAttr(b []byte) []byte { return e.appendAttr(b, nil, nil) }

// appendAttr is AppendAttr given e.Ptr's hex digits (nil: formatted here)
// and the CSV writer's run of allocation ids (nil: each formatted alone).
func (e *Event) appendAttr(b, ptrHex []byte, ids *decRun) []byte {
	b = append(b, '{')
	n := len(b) // a pair after the first starts with ','
	switch e.Kind {
	case KindMalloc, KindFree:
		b = append(b, "allocation_id:"...)
		if ids != nil {
			b = ids.append(b, e.AllocID)
		} else {
			b = appendUint(b, e.AllocID)
		}
		b = append(b, ",addr:0x"...)
		if ptrHex != nil {
			b = append(b, ptrHex...)
		} else {
			b = appendHex(b, e.Ptr)
		}
		b = append(b, ",size:"...)
		b = appendUint(b, e.Size)
		if e.Kind == KindMalloc {
			if e.Owner != "" {
				b = append(b, ",owner:"...)
				b = append(b, e.Owner...)
			}
			if e.Inefficient != "" {
				b = append(b, ",inefficient:"...)
				b = append(b, e.Inefficient...)
			}
			if e.Shadow {
				b = append(b, ",shadow:true"...)
			}
		}
	case KindMstx:
		b = append(b, "id:"...)
		b = appendUint(b, e.MstxID)
	}
	for _, kv := range e.Extra {
		if len(b) > n {
			b = append(b, ',')
		}
		b = append(b, kv.Key...)
		b = append(b, ':')
		b = append(b, kv.Value...)
	}
	return append(b, '}')
}

// Attr returns the Attr column as a string.
func (e *Event) Attr() string { return string(e.AppendAttr(nil)) }

// CleanAttrValue makes a value safe for the Attr column, whose values never
// contain ',', '{' or '}' (SPEC §2.1).
func CleanAttrValue(s string) string {
	if !strings.ContainsAny(s, ",{}") {
		return s
	}
	return strings.NewReplacer(",", "|", "{", "(", "}", ")").Replace(s)
}

// Stream yields events in order. Next returns (nil, nil) at the end.
type Stream interface {
	Next() (*Event, error)
}

// ErrStop, returned by Each's function, ends Each early without an error.
var ErrStop = errors.New("stop")

// Each calls fn on every event of s in order, until s ends or fails or fn
// returns an error (ErrStop: stop there, no error).
func Each(s Stream, fn func(*Event) error) error {
	for {
		e, err := s.Next()
		if err != nil || e == nil {
			return err
		}
		if err := fn(e); err != nil {
			if err == ErrStop {
				return nil
			}
			return err
		}
	}
}

// ReadAll reads s to its end; the events are copies (an Input may reuse its
// own).
func ReadAll(s Stream) ([]Event, error) {
	var evs []Event
	err := Each(s, func(e *Event) error { evs = append(evs, *e); return nil })
	return evs, err
}
