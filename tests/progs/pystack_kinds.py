"""Python stacks of each kind of frame (tests/pystack_test.go and
python/tests/test_collect.py): bytearrays of known sizes from a method, a
generator, a lambda that C code calls, a multi-line call, a thread and a
function whose name is not ASCII; beside each, the stack as Python itself
sees it (the oracle)."""
import sys, threading

def where():
    f, out = sys._getframe(1), []
    while f:
        out.append("%s:%d(%s)" % (f.f_code.co_filename, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return ";".join(out)

def make_block(n):
    b = bytearray(n); print("STACK", n + 1, where())   # the block
    return b

class K:
    def method(self, n):
        return make_block(n)   # the method

def gen(n):
    yield make_block(n)   # the gen

def via_c(n):
    return list(map(lambda m: make_block(m), [n]))   # the map

def multi(n):
    return [
        0,
        make_block(n),   # the multi
    ]

def th():
    make_block(1000005)   # the thread

def Ωmega(n):
    return make_block(n)   # the names

a = K().method(1000001)
b = next(gen(1000002))
c = via_c(1000003)
d = multi(1000004)
e = Ωmega(1000006)
t = threading.Thread(target=th)
t.start()
t.join()
print("ok")
