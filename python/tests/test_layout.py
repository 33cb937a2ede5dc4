"""The CPython 3.11 offsets hardcoded in libmemscope/pystack.c, checked
against the interpreter's own headers (internal ones included)."""
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import pytest

from conftest import REPO

FIELDS = {
    "TS_CFRAME": "offsetof(PyThreadState, cframe)",
    "CF_CURRENT_FRAME": "offsetof(_PyCFrame, current_frame)",
    "FR_CODE": "offsetof(_PyInterpreterFrame, f_code)",
    "FR_PREVIOUS": "offsetof(_PyInterpreterFrame, previous)",
    "FR_PREV_INSTR": "offsetof(_PyInterpreterFrame, prev_instr)",
    "FR_OWNER": "offsetof(_PyInterpreterFrame, owner)",
    "OWNED_BY_GENERATOR": "FRAME_OWNED_BY_GENERATOR",
    "OB_TYPE": "offsetof(PyObject, ob_type)",
    "CO_FIRSTLINENO": "offsetof(PyCodeObject, co_firstlineno)",
    "CO_FILENAME": "offsetof(PyCodeObject, co_filename)",
    "CO_NAME": "offsetof(PyCodeObject, co_name)",
    "CO_QUALNAME": "offsetof(PyCodeObject, co_qualname)",
    "CO_LINETABLE": "offsetof(PyCodeObject, co_linetable)",
    "CO_FIRSTTRACEABLE": "offsetof(PyCodeObject, _co_firsttraceable)",
    "CO_CODE": "offsetof(PyCodeObject, co_code_adaptive)",
    "STR_LENGTH": "offsetof(PyASCIIObject, length)",
    "STR_STATE": "offsetof(PyASCIIObject, state)",
    "STR_ASCII_DATA": "sizeof(PyASCIIObject)",
    "STR_UTF8_LENGTH": "offsetof(PyCompactUnicodeObject, utf8_length)",
    "STR_UTF8": "offsetof(PyCompactUnicodeObject, utf8)",
    "STR_COMPACT_DATA": "sizeof(PyCompactUnicodeObject)",
    "BYTES_SIZE": "offsetof(PyVarObject, ob_size)",
    "BYTES_DATA": "offsetof(PyBytesObject, ob_sval)",
}


def test_pystack_offsets_match_headers(tmp_path):
    if sys.version_info[:2] != (3, 11):
        pytest.skip("the layout is CPython 3.11's")
    inc = sysconfig.get_paths()["include"]
    src = os.path.join(REPO, "libmemscope", "pystack.c")
    if not os.path.exists(os.path.join(inc, "internal", "pycore_frame.h")) or not shutil.which("gcc"):
        pytest.skip("no Python headers or no C compiler")
    if not os.path.exists(src):
        pytest.skip("no source tree")
    with open(src) as f:
        consts = dict(re.findall(r"^#define (\w+) (\d+)", f.read(), re.M))
    prog = ["#define Py_BUILD_CORE 1", "#include <Python.h>", "#include <stddef.h>", "#include <stdio.h>",
            '#include "internal/pycore_frame.h"', "int main(void) {"]
    prog += ['printf("%s %%zu\\n", (size_t)(%s));' % (k, v) for k, v in FIELDS.items()]
    prog += ["return 0; }"]
    (tmp_path / "l.c").write_text("\n".join(prog))
    subprocess.run(["gcc", "-I", inc, "-o", str(tmp_path / "l"), str(tmp_path / "l.c")], check=True)
    out = subprocess.run([str(tmp_path / "l")], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        k, v = line.split()
        assert int(consts[k]) == int(v), "%s: pystack.c says %s, the 3.11 headers %s" % (k, consts[k], v)
