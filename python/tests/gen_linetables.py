"""Writes spool/testdata/py3XX_linetables.json: real CPython code objects'
line tables with what co_lines() says and each instruction's line, for the
Go decoder's unit test (spool/pycode_test.go). Run with the interpreter
whose tables you want (3.10 to 3.13), e.g.

    python3.10 python/tests/gen_linetables.py spool/testdata/py310_linetables.json

Each instruction's line is co_positions()' from 3.11 on; 3.10 has no
co_positions(), so it is the line of the co_lines() range holding the
instruction's offset (what 3.10's PyCode_Addr2Line computes).
"""
import argparse
import json
import sys
import types

SOURCE = '''
import os

def simple(a, b):
    return a + b

def loops(n):
    total = 0
    for i in range(n):
        if i % 2:
            total += i
        else:
            total -= 1
    while total > 100:
        total //= 2
    return total

class K:
    def method(self, x):
        try:
            y = 1 / x
        except ZeroDivisionError:
            y = 0
        finally:
            self.done = True
        return [v * 2 for v in range(y)]

    @property
    def prop(self):
        return {k: v for k, v in
                zip("abc",
                    range(3))}

def gen():
    yield 1
    yield from range(3)

async def coro():
    return await other()

def far():
    x = 1
''' + "\n" * 300 + '''
    return x

lam = lambda q: (q,
    q + 1,
    q + 2)

def closure():
    a = 1
    def inner():
        nonlocal a
        a += 1
        return a
    return inner
'''


def walk(code, out):
    out.append(code)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            walk(c, out)


def positions_310(c):
    n = len(c.co_code) // 2
    out = [-1] * n
    for s, e, l in c.co_lines():
        for i in range(s // 2, min(e // 2, n)):
            out[i] = -1 if l is None else l
    return out


def main():
    if not (3, 10) <= sys.version_info[:2] <= (3, 13):
        sys.exit("needs CPython 3.10 to 3.13")
    codes = []
    walk(compile(SOURCE, "snippet.py", "exec"), codes)
    import json.decoder as jd
    for mod in (argparse, jd):
        with open(mod.__file__) as f:
            walk(compile(f.read(), mod.__file__, "exec"), codes)
    rows = []
    for c in codes:
        rows.append({
            "name": getattr(c, "co_qualname", c.co_name),
            "firstlineno": c.co_firstlineno,
            "linetable": c.co_linetable.hex(),
            "lines": [[s, e, -1 if l is None else l] for s, e, l in c.co_lines()],
            "positions": positions_310(c) if sys.version_info < (3, 11)
            else [-1 if p[0] is None else p[0] for p in c.co_positions()],
        })
    with open(sys.argv[1], "w") as f:
        json.dump(rows, f, separators=(",", ":"))
        f.write("\n")
    print(len(rows), "code objects")


if __name__ == "__main__":
    main()
