"""The offline API of SPEC §6: list_analyzers, get_analyzer_config, analyze,
check_leaks, check_inefficient and the analyzer classes, on dumps planted
with known situations, written here as CSV (the csv module) and as SQLite
(the sqlite3 module): both formats must give the same results.
"""
import csv
import os
import sqlite3

import pytest

import msmemscope
from msmemscope.analyzer import InefficientAnalyzer, InefficientConfig, LeaksAnalyzer, LeaksConfig

HEADER = ["ID", "Event", "Event Type", "Name", "Timestamp(ns)", "Process Id", "Thread Id", "Device Id", "Ptr", "Attr",
          "Call Stack(Python)", "Call Stack(C)"]


class Dump:
    """Rows of a memscope_dump, built in order."""

    def __init__(self):
        self.rows = []
        self.aid = 0
        self.blocks = {}
        self.add("SYSTEM", "START")

    def add(self, event, etype, name="N/A", device="N/A", ptr="N/A", attr="{}", py="N/A", c="N/A"):
        i = len(self.rows) + 1
        self.rows.append([i, event, etype, name, 1000 + 10 * i, 4242, 4242, device, ptr, attr, py, c])
        return i

    def malloc(self, etype, size):
        self.aid += 1
        a = self.aid
        ptr = "0x%x" % (0x10000 * a)
        dev = "0" if etype == "HAL" else "host"
        attr = "{allocation_id:%d,addr:%s,size:%d,owner:%s}" % (a, ptr, size, etype)
        self.blocks[a] = (etype, size, ptr, dev)
        self.add("MALLOC", etype, device=dev, ptr=ptr, attr=attr, py="model.py:%d(forward)" % a,
                 c="alloc a.c:%d (prog)" % a)
        return a

    def free(self, a):
        etype, size, ptr, dev = self.blocks[a]
        self.add("FREE", etype, device=dev, ptr=ptr, attr="{allocation_id:%d,addr:%s,size:%d}" % (a, ptr, size))

    def mark(self, msg):
        return self.add("MSTX", "Mark", name=msg, attr="{id:%d}" % len(self.rows))

    def op(self, name, accesses=()):
        self.add("OP_LAUNCH", "ATEN_START", name=name, device="host")
        for a in accesses:
            self.access(a, name)
        self.add("OP_LAUNCH", "ATEN_END", name=name, device="host")

    def access(self, a, name):
        self.add("ACCESS", "READ", name=name, device="host",
                 attr="{dtype:float32,shape:[4],size:16,format:N/A,type:PTA,allocation_id:%d}" % a)

    def write_csv(self, path):
        with open(path, "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(HEADER)
            w.writerows(self.rows)
        return str(path)

    def write_db(self, path):
        con = sqlite3.connect(str(path))
        cols = ", ".join('"%s" %s' % (h, "INTEGER" if h in ("ID", "Timestamp(ns)", "Process Id", "Thread Id") else "TEXT")
                         for h in HEADER)
        con.execute("CREATE TABLE memscope_dump (%s)" % cols)
        con.executemany("INSERT INTO memscope_dump VALUES (%s)" % ",".join("?" * len(HEADER)), self.rows)
        con.commit()
        con.close()
        return str(path)


def leaks_dump():
    d = Dump()
    d.malloc("HOST", 100)             # before A
    d.mark("iter")                    # mark 0
    early = d.malloc("HOST", 7)       # between marks 0 and 1
    d.mark("iter")                    # mark 1 = A
    l1 = d.malloc("HOST", 4096)       # leak
    d.mark("other")
    l2 = d.malloc("PTA", 1 << 20)     # leak: freed only after C
    f1 = d.malloc("HOST", 64)
    d.free(f1)
    f2 = d.malloc("PTA", 128)
    l3 = d.malloc("HAL", 2 << 20)     # leak
    d.mark("iter")                    # mark 2 = B
    d.malloc("HOST", 9999)            # after B: not a leak
    d.free(f2)
    d.mark("iter")                    # mark 3 = C
    d.free(l2)
    d.free(early)
    return d, [l1, l2, l3]


def ineff_dump():
    d = Dump()
    z = d.malloc("PTA", 10)           # api 1
    d.add("OP_LAUNCH", "ATEN_START", name="aten::a", device="host")   # api 2
    e = d.malloc("PTA", 1000)
    d.add("OP_LAUNCH", "ATEN_END", name="aten::a", device="host")
    d.free(z)                         # api 3
    d.op("aten::b", [e])              # api 4: early_allocation
    d.add("OP_LAUNCH", "ATEN_START", name="aten::c", device="host")   # api 5
    l = d.malloc("PTA", 2000)
    d.access(l, "aten::c")
    d.add("OP_LAUNCH", "ATEN_END", name="aten::c", device="host")
    d.add("OP_LAUNCH", "ATEN_START", name="aten::d", device="host")   # api 6
    m = d.malloc("PTA", 50)
    d.add("OP_LAUNCH", "ATEN_END", name="aten::d", device="host")
    d.free(l)                         # api 7: late_deallocation
    d.add("OP_LAUNCH", "ATEN_START", name="aten::e", device="host")   # api 8
    i = d.malloc("PTA", 4096)
    d.access(i, "aten::e")
    d.add("OP_LAUNCH", "ATEN_END", name="aten::e", device="host")
    for _ in range(4):                # apis 9..12
        d.op("aten::f")
    d.op("aten::g", [i])              # api 13: temporary_idleness (gap 5 > 3)
    d.op("aten::h", [i])              # api 14
    k = d.malloc("PTA", 8192)         # api 15
    d.free(k)
    d.free(m)
    d.free(e)                         # api 18: late_deallocation too
    return d, e, l, i


def ineff_of(path):
    """{allocation_id: inefficient} of the MALLOC rows, read with Python's
    own csv/sqlite3 modules."""
    if path.endswith(".csv"):
        with open(path, newline="") as f:
            rows = [(r["Event"], r["Attr"]) for r in csv.DictReader(f)]
    else:
        con = sqlite3.connect(path)
        rows = con.execute('SELECT "Event", "Attr" FROM memscope_dump ORDER BY "ID"').fetchall()
        con.close()
    out = {}
    for event, attr in rows:
        if event != "MALLOC":
            continue
        kv = dict(p.split(":", 1) for p in attr[1:-1].split(","))
        if "inefficient" in kv:
            out[int(kv["allocation_id"])] = kv["inefficient"]
    return out


def test_list_and_config():
    assert msmemscope.list_analyzers() == ["leaks", "inefficient"]
    leaks = msmemscope.get_analyzer_config("leaks")
    assert list(leaks) == ["input_path", "mstx_info", "start_index", "event_type"]
    assert leaks["start_index"]["type"] == "int" and leaks["start_index"]["required"]
    assert leaks["event_type"]["default"] is None
    ineff = msmemscope.get_analyzer_config("inefficient")
    assert list(ineff) == ["input_path", "mem_size", "inefficient_type", "idle_threshold"]
    assert ineff["idle_threshold"]["default"] == 3000 and ineff["mem_size"]["default"] == 0
    with pytest.raises(ValueError, match="unknown analyzer"):
        msmemscope.get_analyzer_config("watch")


def test_check_leaks_csv_and_db(tmp_path, capsys):
    d, want = leaks_dump()
    results = []
    for path in (d.write_csv(tmp_path / "dump.csv"), d.write_db(tmp_path / "dump.db")):
        leaks = msmemscope.check_leaks(path, mstx_info="iter", start_index=1)
        assert [b["allocation_id"] for b in leaks] == want
        assert [b["size"] for b in leaks] == [4096, 1 << 20, 2 << 20]
        assert leaks[1]["event_type"] == "PTA" and leaks[1]["ptr"] == "0x%x" % (0x10000 * want[1])
        assert leaks[1]["python_stack"] == "model.py:%d(forward)" % want[1]
        assert leaks[1]["c_stack"] == "alloc a.c:%d (prog)" % want[1]
        out = capsys.readouterr().out
        assert "3 blocks" in out and path in out
        assert [b["allocation_id"] for b in msmemscope.check_leaks(path, "iter", 1, event_type="HAL")] == [want[2]]
        assert msmemscope.analyze("leaks", input_path=path, mstx_info="iter", start_index=1) == leaks
        results.append(leaks)
    assert results[0] == results[1]


def test_check_leaks_not_enough_marks(tmp_path):
    d, _ = leaks_dump()
    p = d.write_csv(tmp_path / "dump.csv")
    with pytest.raises(ValueError, match="found 4 MSTX marks"):
        msmemscope.check_leaks(p, "iter", 2)


def test_check_inefficient_twice(tmp_path, capsys):
    d, e, l, i = ineff_dump()
    summaries = []
    for path in (d.write_csv(tmp_path / "dump.csv"), d.write_db(tmp_path / "dump.db")):
        s = msmemscope.check_inefficient(path, mem_size=100, inefficient_type=["early_allocation"], idle_threshold=3)
        assert s["results_added"] == 1 and s["file_rewritten"]
        assert ineff_of(path) == {e: "early_allocation"}
        s = msmemscope.check_inefficient(path, mem_size=100, idle_threshold=3)
        assert s["results_added"] == 3
        want = {e: "early_allocation|late_deallocation", l: "late_deallocation", i: "temporary_idleness"}
        assert ineff_of(path) == want
        assert s["summary"] == {
            "early_allocation": {"blocks": 1, "bytes": 1000, "api_span": 2},
            "late_deallocation": {"blocks": 2, "bytes": 3000, "api_span": 16},
            "temporary_idleness": {"blocks": 1, "bytes": 4096, "api_span": 5},
        }
        before = open(path, "rb").read()
        s = msmemscope.check_inefficient(path, mem_size=100, idle_threshold=3)
        assert s["results_added"] == 0 and not s["file_rewritten"]
        assert open(path, "rb").read() == before
        assert ineff_of(path) == want
        out = capsys.readouterr().out
        assert "temporary_idleness" in out
        del s["input_path"]
        summaries.append(s)
    assert summaries[0] == summaries[1]


def test_analyzer_classes(tmp_path):
    d, want = leaks_dump()
    p = d.write_csv(tmp_path / "dump.csv")
    cfg = LeaksConfig(input_path=p, mstx_info="iter", start_index=1)
    assert [b["allocation_id"] for b in LeaksAnalyzer().analyze(cfg)] == want
    d2, e, l, i = ineff_dump()
    p2 = d2.write_db(tmp_path / "ineff.db")
    cfg = InefficientConfig(input_path=p2, mem_size=100, inefficient_type="temporary_idleness", idle_threshold=3)
    assert cfg.inefficient_type == ["temporary_idleness"]
    s = InefficientAnalyzer().analyze(cfg)
    assert s["results_added"] == 1 and ineff_of(p2) == {i: "temporary_idleness"}
    with pytest.raises(ValueError):
        InefficientConfig(input_path=p2, inefficient_type=["slow"])
    with pytest.raises(ValueError):
        InefficientConfig(input_path=p2, idle_threshold=0)
    with pytest.raises(TypeError):
        InefficientConfig(input_path=p2, mem_size="1")
    with pytest.raises(ValueError):
        LeaksConfig(input_path=p, mstx_info=" ", start_index=0)
    with pytest.raises(TypeError):
        LeaksAnalyzer().analyze(InefficientConfig(input_path=p2))


def test_bad_inputs(tmp_path):
    with pytest.raises(IsADirectoryError):
        msmemscope.check_leaks(str(tmp_path), "x", 0)
    with pytest.raises(FileNotFoundError):
        msmemscope.check_inefficient(str(tmp_path / "none.csv"))
    d, _ = leaks_dump()
    rows = d.rows
    rows[5][9] = "{allocation_id:3,addr:0x30000,size:12k}"
    bad = d.write_csv(tmp_path / "bad.csv")
    before = open(bad, "rb").read()
    with pytest.raises(ValueError) as ei:
        msmemscope.check_inefficient(bad)
    assert str(ei.value).startswith(bad + ":7: malformed Attr") and "bad size" in str(ei.value)
    assert open(bad, "rb").read() == before
    nodump = str(tmp_path / "other.db")
    con = sqlite3.connect(nodump)
    con.execute("CREATE TABLE t (a)")
    con.close()
    with pytest.raises(ValueError, match="no table memscope_dump"):
        msmemscope.check_leaks(nodump, "x", 0)
    with pytest.raises(TypeError, match="start_index"):
        msmemscope.check_leaks(bad, "x", "0")
    with pytest.raises(TypeError, match="unexpected keyword"):
        msmemscope.analyze("leaks", input_path=bad, mstx_info="x", start_index=0, extra=1)
    with pytest.raises(ValueError, match="unknown inefficient_type"):
        msmemscope.check_inefficient(bad, inefficient_type="late")
    with pytest.raises(TypeError):
        msmemscope.check_inefficient(bad, mem_size=1.5)
    with pytest.raises(TypeError):
        msmemscope.check_inefficient(bad, idle_threshold=True)


def test_cut_inputs(tmp_path):
    """A dump cut short is a ValueError naming the file (and the line): cut
    inside its last field, or, in its capture folder, at a row boundary
    (config.json's events_written counts the rows); a DB cut short too."""
    d, _ = leaks_dump()
    whole = open(d.write_csv(tmp_path / "whole.csv"), "rb").read()
    for n, cut in enumerate((whole[:-2], whole[:-1], whole[:len(whole) // 2])):
        p = tmp_path / ("cut%d.csv" % n)
        p.write_bytes(cut)
        for fn in (lambda: msmemscope.check_leaks(str(p), "iter", 1), lambda: msmemscope.get_all_time_size(str(p))):
            with pytest.raises(ValueError) as ei:
                fn()
            assert str(ei.value).startswith(str(p) + ":") and str(ei.value).endswith("(the file is cut short or damaged)")
    capture = tmp_path / "msmemscope_1_20260101000000"
    (capture / "dump").mkdir(parents=True)
    (capture / "config.json").write_text('{"events_written": %d}' % len(d.rows))
    dump = capture / "dump" / "memscope_dump_20260101000000.csv"
    dump.write_bytes(whole)
    assert len(msmemscope.check_leaks(str(dump), "iter", 1)) == 3
    dump.write_bytes(whole[:whole.rindex(b"\n", 0, -1) + 1])  # the last row left out
    with pytest.raises(ValueError, match="%d rows, but .*config.json says events_written %d" % (len(d.rows) - 1, len(d.rows))):
        msmemscope.check_leaks(str(dump), "iter", 1)
    db = open(d.write_db(tmp_path / "whole.db"), "rb").read()
    (tmp_path / "cut.db").write_bytes(db[:len(db) // 2])
    with pytest.raises(ValueError, match="cut.db"):
        msmemscope.check_leaks(str(tmp_path / "cut.db"), "iter", 1)


def test_help_lists_the_whole_api():
    """help(msmemscope) shows what `__all__` names: every public function,
    the offline analyses and the reports included, and each name exists."""
    import pydoc
    want = {"config", "start", "stop", "step", "tracer", "mstx", "describe", "watch",
            "get_mem_report", "get_all_time_size", "get_mem_report_with_time",
            "list_analyzers", "get_analyzer_config", "analyze", "check_leaks", "check_inefficient"}
    assert want <= set(msmemscope.__all__)
    for name in msmemscope.__all__:
        assert hasattr(msmemscope, name), name
    text = pydoc.render_doc(msmemscope, renderer=pydoc.plaintext)
    for name in ("check_leaks", "check_inefficient", "analyze", "get_all_time_size"):
        assert name in text, name
