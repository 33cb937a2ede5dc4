// The CPython layouts pystack.c reads, one per supported version (x86-64,
// the default build: no free threading, no Py_TRACE_REFS). Offsets only, so
// python/tests/test_layout.py can compile this header beside an
// interpreter's own headers (internal ones included) and compare each value
// with offsetof. -1 marks a field the version lacks.
#ifndef MEMSCOPE_PYLAYOUT_H
#define MEMSCOPE_PYLAYOUT_H

#include <stdint.h>

// The same in every supported version.
#define PYL_OB_TYPE 8     // PyObject.ob_type
#define PYL_BYTES_SIZE 16 // PyVarObject.ob_size
#define PYL_BYTES_DATA 32 // PyBytesObject.ob_sval

typedef struct {
	uint16_t version; // major << 8 | minor
	// The thread's innermost frame: *(ts + ts_frame), then, where
	// cf_current_frame >= 0, *(that + cf_current_frame) (3.11 and 3.12 go
	// through PyThreadState.cframe).
	int16_t ts_frame, cf_current_frame;
	int16_t fr_code;     // f_code (f_executable on 3.13: maybe not a code object)
	int16_t fr_previous; // previous (f_back on 3.10)
	// The instruction: an int index in code units (f_lasti, 3.10) when
	// instr_is_index, else a pointer into co_code_adaptive (prev_instr on
	// 3.11 and 3.12, instr_ptr on 3.13: both at the instruction executing).
	int16_t fr_instr, instr_is_index;
	int16_t fr_owner; // char owner; -1 on 3.10 (no owner)
	// FRAME_OWNED_BY_GENERATOR and FRAME_OWNED_BY_CSTACK (entry shims, 3.12
	// on); -1 where the version has none.
	int16_t owned_by_generator, owned_by_cstack;
	int16_t co_firstlineno, co_filename, co_name;
	int16_t co_qualname; // co_name's offset on 3.10 (no co_qualname there)
	int16_t co_linetable;
	int16_t co_firsttraceable, co_code; // _co_firsttraceable, co_code_adaptive; -1 on 3.10
	int16_t linetable_format; // PYLT_LOCATIONS (0) or PYLT_PEP626 (1), records_gen.h
	// PyASCIIObject / PyCompactUnicodeObject (3.12 dropped wstr).
	int16_t str_length, str_state, str_ascii_data, str_utf8_length, str_utf8, str_compact_data;
	// The state bitfield, as a 32-bit word: kind's lowest bit, compact's and
	// ascii's masks.
	int16_t st_kind_shift;
	uint16_t st_compact, st_ascii;
} ms_pylayout;

static const ms_pylayout ms_pylayouts[] = {
    {.version = 0x030A, .ts_frame = 24, .cf_current_frame = -1, .fr_code = 32, .fr_previous = 24, .fr_instr = 96,
     .instr_is_index = 1, .fr_owner = -1, .owned_by_generator = -1, .owned_by_cstack = -1, .co_firstlineno = 40, .co_filename = 104,
     .co_name = 112, .co_qualname = 112, .co_linetable = 120, .co_firsttraceable = -1, .co_code = -1,
     .linetable_format = 1, .str_length = 16, .str_state = 32, .str_ascii_data = 48, .str_utf8_length = 48,
     .str_utf8 = 56, .str_compact_data = 72, .st_kind_shift = 2, .st_compact = 0x20, .st_ascii = 0x40},
    {.version = 0x030B, .ts_frame = 56, .cf_current_frame = 8, .fr_code = 32, .fr_previous = 48, .fr_instr = 56,
     .instr_is_index = 0, .fr_owner = 69, .owned_by_generator = 1, .owned_by_cstack = -1, .co_firstlineno = 72, .co_filename = 112,
     .co_name = 120, .co_qualname = 128, .co_linetable = 136, .co_firsttraceable = 168, .co_code = 184,
     .linetable_format = 0, .str_length = 16, .str_state = 32, .str_ascii_data = 48, .str_utf8_length = 48,
     .str_utf8 = 56, .str_compact_data = 72, .st_kind_shift = 2, .st_compact = 0x20, .st_ascii = 0x40},
    {.version = 0x030C, .ts_frame = 56, .cf_current_frame = 0, .fr_code = 0, .fr_previous = 8, .fr_instr = 56,
     .instr_is_index = 0, .fr_owner = 70, .owned_by_generator = 1, .owned_by_cstack = 3, .co_firstlineno = 68, .co_filename = 112,
     .co_name = 120, .co_qualname = 128, .co_linetable = 136, .co_firsttraceable = 176, .co_code = 192,
     .linetable_format = 0, .str_length = 16, .str_state = 32, .str_ascii_data = 40, .str_utf8_length = 40,
     .str_utf8 = 48, .str_compact_data = 56, .st_kind_shift = 2, .st_compact = 0x20, .st_ascii = 0x40},
    {.version = 0x030D, .ts_frame = 72, .cf_current_frame = -1, .fr_code = 0, .fr_previous = 8, .fr_instr = 56,
     .instr_is_index = 0, .fr_owner = 70, .owned_by_generator = 1, .owned_by_cstack = 3, .co_firstlineno = 68, .co_filename = 112,
     .co_name = 120, .co_qualname = 128, .co_linetable = 136, .co_firsttraceable = 184, .co_code = 200,
     .linetable_format = 0, .str_length = 16, .str_state = 32, .str_ascii_data = 40, .str_utf8_length = 40,
     .str_utf8 = 48, .str_compact_data = 56, .st_kind_shift = 2, .st_compact = 0x20, .st_ascii = 0x40},
};

#endif
