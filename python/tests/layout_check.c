// Built by test_layout.py against the running interpreter's headers: prints
// "field table header" for each value libmemscope/pylayout.h holds for this
// version, or "missing" when the table has no entry for it.
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include "frameobject.h"
#endif
#include "pylayout.h"

#define P(field, want) printf("%s %ld %ld\n", #field, (long)l->field, (long)(want))
#define C(label, got, want) printf("%s %ld %ld\n", label, (long)(got), (long)(want))

// The state bitfield's word with one field set through the header's names.
#define STATE_WORD(set) \
	({ \
		PyASCIIObject o; \
		unsigned int w; \
		memset(&o, 0, sizeof o); \
		o.state.set; \
		memcpy(&w, (char *)&o + offsetof(PyASCIIObject, state), sizeof w); \
		w; \
	})

int main(void) {
	const ms_pylayout *l = NULL;
	for (size_t i = 0; i < sizeof ms_pylayouts / sizeof ms_pylayouts[0]; i++)
		if (ms_pylayouts[i].version == PY_VERSION_HEX >> 16) l = &ms_pylayouts[i];
	if (!l) {
		printf("missing\n");
		return 0;
	}
#if PY_VERSION_HEX < 0x030B0000
	P(ts_frame, offsetof(PyThreadState, frame));
	P(cf_current_frame, -1);
	P(fr_code, offsetof(PyFrameObject, f_code));
	P(fr_previous, offsetof(PyFrameObject, f_back));
	P(fr_instr, offsetof(PyFrameObject, f_lasti));
	P(instr_is_index, 1);
	P(fr_owner, -1);
	P(owned_by_generator, -1);
	P(owned_by_cstack, -1);
	P(co_qualname, offsetof(PyCodeObject, co_name));
	P(co_firsttraceable, -1);
	P(co_code, -1);
	P(linetable_format, 1);
	C("sizeof_f_lasti", sizeof(((PyFrameObject *)0)->f_lasti), 4);
#else
#if PY_VERSION_HEX < 0x030D0000
	P(ts_frame, offsetof(PyThreadState, cframe));
	P(cf_current_frame, offsetof(_PyCFrame, current_frame));
	P(fr_code, offsetof(_PyInterpreterFrame, f_code));
	P(fr_instr, offsetof(_PyInterpreterFrame, prev_instr));
#else
	P(ts_frame, offsetof(PyThreadState, current_frame));
	P(cf_current_frame, -1);
	P(fr_code, offsetof(_PyInterpreterFrame, f_executable));
	P(fr_instr, offsetof(_PyInterpreterFrame, instr_ptr));
#endif
	P(fr_previous, offsetof(_PyInterpreterFrame, previous));
	P(instr_is_index, 0);
	P(fr_owner, offsetof(_PyInterpreterFrame, owner));
	P(owned_by_generator, FRAME_OWNED_BY_GENERATOR);
#if PY_VERSION_HEX >= 0x030C0000
	P(owned_by_cstack, FRAME_OWNED_BY_CSTACK);
#else
	P(owned_by_cstack, -1);
#endif
	P(co_qualname, offsetof(PyCodeObject, co_qualname));
	P(co_firsttraceable, offsetof(PyCodeObject, _co_firsttraceable));
	P(co_code, offsetof(PyCodeObject, co_code_adaptive));
	P(linetable_format, 0);
	C("sizeof_owner", sizeof(((_PyInterpreterFrame *)0)->owner), 1);
	C("sizeof_codeunit", sizeof(_Py_CODEUNIT), 2); // the instruction index counts code units
#endif
	P(co_firstlineno, offsetof(PyCodeObject, co_firstlineno));
	P(co_filename, offsetof(PyCodeObject, co_filename));
	P(co_name, offsetof(PyCodeObject, co_name));
	P(co_linetable, offsetof(PyCodeObject, co_linetable));
	P(str_length, offsetof(PyASCIIObject, length));
	P(str_state, offsetof(PyASCIIObject, state));
	P(str_ascii_data, sizeof(PyASCIIObject));
	P(str_utf8_length, offsetof(PyCompactUnicodeObject, utf8_length));
	P(str_utf8, offsetof(PyCompactUnicodeObject, utf8));
	P(str_compact_data, sizeof(PyCompactUnicodeObject));
	P(st_kind_shift, __builtin_ctz(STATE_WORD(kind = 1)));
	C("st_kind_width", STATE_WORD(kind = 7) >> l->st_kind_shift, 7); // kind is 3 bits wide
	P(st_compact, STATE_WORD(compact = 1));
	P(st_ascii, STATE_WORD(ascii = 1));
	C("PYL_OB_TYPE", PYL_OB_TYPE, offsetof(PyObject, ob_type));
	C("PYL_BYTES_SIZE", PYL_BYTES_SIZE, offsetof(PyVarObject, ob_size));
	C("PYL_BYTES_DATA", PYL_BYTES_DATA, offsetof(PyBytesObject, ob_sval));
	C("sizeof_co_firstlineno", sizeof(((PyCodeObject *)0)->co_firstlineno), 4);
	return 0;
}
