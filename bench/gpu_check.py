#!/usr/bin/env python3
"""make gpu-check: msmemscope's CUDA layer on a real GPU, in a few minutes.

Needs only what travels with it: build/ (the CLI and the library, built
elsewhere: no Go here), python/ (the package, by PYTHONPATH), an interpreter
with PyTorch on CUDA, and the standard library. Writes one JSON of results
(--out) and prints a summary; exits 0 when every exact comparison held, 1
when one did not, 2 when there is no CUDA device.

A small training loop (an MLP, Adam) runs bare, under torch.profiler, and
under msmemscope with each of PyTorch's allocators: the default caching
allocator, expandable_segments:True and backend:cudaMallocAsync. After every
step the script records torch.cuda's own figures and marks the step
(mstx), and the check compares, at each mark:
  * the HAL bytes alive (driver allocations msmemscope recorded) with
    torch.cuda.memory_reserved(): cuMemAlloc blocks for the default
    allocator, cuMemCreate blocks for expandable segments (exact);
  * with the operator hooks on (the default options), the PTA bytes alive
    on device 0 (the tensor blocks, from the caching allocator's history:
    the sizes asked for) with memory_stats()'s requested_bytes, and their
    peak with its peak, for the caching allocator's two variants; with
    cudaMallocAsync (no rounding) with memory_allocated() and
    max_memory_allocated() (exact);
    decompose's requested line at the end with the same figure, and, for
    the caching allocator's two variants, its reserved line with
    memory_reserved() and its cached_free line with their difference; the
    same with Python stacks on (default allocator);
  * the --export=memory_viz pickle, read by torch.cuda._memory_viz: its
    segments are the driver blocks alive at the end (none twice), its
    active blocks the live tensor bytes, its trace in time order;
  * the kernel launches recorded (--level=kernel) with torch.profiler's
    kernel count over the same steps;
  * torch.cuda.nvtx's range and mark of each step with their MSTX rows;
  * the step time, traced over bare, with the driver layer alone
    (--device=cuda; --pairs runs of each, in turn) and with the default
    options and the operator hooks.
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TRAIN = r'''
import json, os, sys, time
import torch
mark = step = None
if os.environ.get("GPUCHECK_TRACED"):
    import msmemscope
    mark, step = msmemscope.mstx.mark, msmemscope.step
steps, profiled = int(sys.argv[1]), sys.argv[2] == "profile"
smoke = os.environ.get("GPUCHECK_SMOKE") == "1"  # the check's own test, on a CPU
nvtx = os.environ.get("GPUCHECK_NVTX") == "1" and not smoke
if smoke:
    for name in ("synchronize", "memory_allocated", "max_memory_allocated", "memory_reserved"):
        setattr(torch.cuda, name, lambda *a: 0)
    torch.cuda.get_device_name = lambda *a: "none (smoke test on the CPU)"
    torch.cuda.memory_stats = lambda *a: {"requested_bytes.all.current": 0, "requested_bytes.all.peak": 0}
torch.manual_seed(0)
dev = torch.device("cpu" if smoke else "cuda")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                            torch.nn.ReLU(), torch.nn.Linear(4096, 512)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(256, 1024, device=dev), torch.randn(256, 512, device=dev)
prof = None
out = []
for i in range(steps):
    if profiled and i == 1:  # kernels of steps 1.. (step 0 warms up)
        from torch.profiler import profile, ProfilerActivity
        prof = profile(activities=[ProfilerActivity.CPU if smoke else ProfilerActivity.CUDA])
        prof.__enter__()
    if nvtx:
        torch.cuda.nvtx.range_push("nvtx step %d" % i)
    torch.cuda.synchronize()
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    if nvtx:  # NVTX from PyTorch's own bindings: MSTX rows through msmemscope's injection
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.mark("nvtx mark %d" % i)
    st = torch.cuda.memory_stats()
    out.append({"step": i, "seconds": dt, "allocated": torch.cuda.memory_allocated(),
                "max_allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                "requested": st.get("requested_bytes.all.current"), "max_requested": st.get("requested_bytes.all.peak")})
    if mark:
        mark("gpucheck %d" % i)
        step()  # a device SNAPSHOT row (cuMemGetInfo) each
oom = None
if os.environ.get("GPUCHECK_OOM"):  # a request no GPU holds: an OOM row and its report
    try:
        torch.empty(1 << 42, dtype=torch.uint8, device=dev)
    except getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError):
        oom = True
    except RuntimeError:
        oom = "smoke" if smoke else False
kernels = None
if prof is not None:
    prof.__exit__(None, None, None)
    kernels = sum(1 for e in prof.events() if str(e.device_type).endswith("CUDA")
                  and not e.name.startswith(("Memcpy", "Memset")))
print("GPUCHECK " + json.dumps({"steps": out, "kernels": kernels, "oom": oom, "torch": torch.__version__,
                                 "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0)}))
'''


def attrs(s: str) -> dict:
    out = {}
    for kv in s.strip("{}").split(","):
        k, _, v = kv.partition(":")
        out[k] = v
    return out


def read_capture(out: str) -> dict:
    """HAL bytes alive per kind at each step's mark, kernel launches between
    marks, and the row counts, from the main process's dump."""
    man = json.load(open(glob.glob(os.path.join(out, "run_*.json"))[0]))
    folder = [p for p in man["processes"] if p.get("main")][0]["folder"]
    dump = glob.glob(os.path.join(folder, "dump", "memscope_dump_*.csv"))[0]
    live = {"device": 0, "managed": 0, "vmm": 0, "pinned": 0}
    # Inside PyTorch: allocated by its caching allocator (libc10_cuda in the
    # C stack); the rest is other libraries' (cuBLAS's handles...).
    live.update({"torch_" + k: 0 for k in list(live)})
    kind_of = {}
    pta = {"live": 0, "peak": 0}  # tensor blocks on device 0
    pta_size = {}
    pta_at = []
    at_mark, launches, marks = [], 0, []
    rows = {"HAL": 0, "HOST_PINNED": 0, "KERNEL_LAUNCH": 0, "KERNEL_UNNAMED": 0, "OOM": 0, "SNAPSHOT_DEVICE": 0,
            "MAP": 0, "UNMAP": 0, "all": 0}
    names = {}
    nvtx_rows = {}  # NVTX's MSTX rows by Event Type
    with open(dump, newline="") as f:
        r = csv.reader(f)
        head = next(r)
        ev, ty, name, at = head.index("Event"), head.index("Event Type"), head.index("Name"), head.index("Attr")
        cst = head.index("Call Stack(C)")
        for row in r:
            rows["all"] += 1
            t = row[ty]
            if row[ev] == "OOM":
                rows["OOM"] += 1
            elif row[ev] == "SNAPSHOT" and row[head.index("Device Id")] == "0":
                rows["SNAPSHOT_DEVICE"] += 1
            elif row[ev] in ("MAP", "UNMAP"):  # VMM mappings (expandable segments): no bytes of their own
                rows[row[ev]] += 1
            elif t == "PTA" and row[head.index("Device Id")] == "0":
                a = attrs(row[at])
                if row[ev] == "MALLOC":
                    pta_size[a["allocation_id"]] = int(a["size"])
                    pta["live"] += int(a["size"])
                    pta["peak"] = max(pta["peak"], pta["live"])
                elif row[ev] == "FREE":
                    pta["live"] -= pta_size.pop(a.get("allocation_id"), 0)
            elif t in ("HAL", "HOST_PINNED"):
                rows[t] += 1
                a = attrs(row[at])
                size = int(a.get("size", 0))
                if row[ev] == "MALLOC":
                    k = "pinned" if t == "HOST_PINNED" else a.get("kind", "device")
                    ks = (k, "torch_" + k) if "libc10_cuda" in row[cst] else (k,)
                    kind_of[a["allocation_id"]] = ks
                    for k in ks:
                        live[k] += size
                elif row[ev] == "FREE":
                    for k in kind_of.pop(a.get("allocation_id"), ()):
                        live[k] -= size
            elif t == "KERNEL_LAUNCH":
                rows[t] += 1
                launches += 1
                rows["KERNEL_UNNAMED"] += row[name] == "N/A"
                names[row[name]] = names.get(row[name], 0) + 1
            elif row[ev] == "MSTX" and row[name].startswith("nvtx "):
                nvtx_rows[row[ty]] = nvtx_rows.get(row[ty], 0) + 1
            elif row[ev] == "MSTX" and row[name].startswith("gpucheck "):
                at_mark.append(dict(live))
                marks.append(launches)
                pta_at.append(dict(pta))
    ooms = []
    for p in glob.glob(os.path.join(folder, "analysis", "oom_report_*.json")):
        ooms += [{k: f[k] for k in ("device", "kind", "requested")} | {"live_total": f["live"]["total_size"],
                 "live_sites": len(f["live"]["mem_report"])} for f in json.load(open(p))]
    top = sorted(names.items(), key=lambda kv: -kv[1])[:8]
    device_lines = {}
    for p in glob.glob(os.path.join(folder, "analysis", "decompose_*.csv")):
        with open(p, newline="") as f:
            device_lines = {r["Name"]: [int(r["Peak(byte)"]), int(r["End(byte)"])] for r in csv.DictReader(f)
                            if r["Kind"] == "cuda:0"}
    viz = read_memory_viz(folder)
    return {"nvtx_rows": nvtx_rows, "pta_at_step": pta_at, "decompose_cuda0": device_lines, "memory_viz": viz, "live_at_step": at_mark, "launches_at_step": marks, "rows": rows, "folder": folder, "oom_reports": ooms,
            "kernel_names_top": top}


def read_memory_viz(folder: str) -> dict | None:
    """The --export=memory_viz pickle of a capture, as PyTorch's own viewer
    code reads it: device 0's segments and active blocks at the end, its
    trace's actions, and whether torch.cuda._memory_viz's text views take it."""
    paths = glob.glob(os.path.join(folder, "export", "memory_viz_*.pickle"))
    if not paths:
        return None
    import pickle
    try:
        with open(paths[0], "rb") as f:
            data = pickle.load(f)
        segs = [s for s in data["segments"] if s["device"] == 0]
        blocks = [b for s in segs for b in s["blocks"] if b["state"] == "active_allocated"]
        trace = data["device_traces"][0] if data["device_traces"] else []
        actions = {}
        for e in trace:
            actions[e["action"]] = actions.get(e["action"], 0) + 1
        addrs = [s["address"] for s in segs]
        out = {"segments": len(segs), "segment_bytes": sum(s["total_size"] for s in segs),
               "segments_at_one_address": len(addrs) - len(set(addrs)),
               "active_blocks": len(blocks), "active_bytes": sum(b["size"] for b in blocks),
               "trace_actions": actions, "devices": len(data["device_traces"]),
               "time_ordered": [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)}
        from torch.cuda import _memory_viz
        out["viewer_reads"] = _memory_viz.trace(data).startswith("Device 0") and "total_allocated" in _memory_viz.segsum(data)
        return out
    except Exception as e:  # recorded, and the check fails on it
        return {"error": "%s: %s" % (type(e).__name__, e)}


def run(script: str, args: argparse.Namespace, alloc_conf: str, traced: list | None, profile: bool = False,
        oom: bool = False, save_as: str = "", nvtx: bool = False) -> dict:
    env = dict(os.environ)
    if oom:
        env["GPUCHECK_OOM"] = "1"
    if nvtx:
        env["GPUCHECK_NVTX"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(args.repo, "python"), env.get("PYTHONPATH")]))
    env["MSMEMSCOPE_LIB"] = os.path.join(args.build, "lib", "libmemscope.so")
    env["MSMEMSCOPE_CLI"] = os.path.join(args.build, "bin", "msmemscope")
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    else:
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    cmd = [sys.executable, script, str(args.steps), "profile" if profile else "no"]
    out = None
    if traced is not None:
        out = tempfile.mkdtemp(prefix="gpucheck_", dir=args.tmp)
        env["GPUCHECK_TRACED"] = "1"
        cmd = [env["MSMEMSCOPE_CLI"], "--output=" + out] + traced + cmd
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    res = {"command": " ".join(cmd[:-3] + ["train.py"] + cmd[-2:]), "alloc_conf": alloc_conf or "default",
           "exit": p.returncode, "whole_seconds": round(time.perf_counter() - t0, 2)}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("GPUCHECK ")]
    if p.returncode != 0 or not lines:
        res["error"] = (p.stderr or p.stdout)[-3000:]
        return res
    res.update(json.loads(lines[-1][len("GPUCHECK "):]))
    times = [s["seconds"] for s in res["steps"][1:]]
    res["median_step_s"] = statistics.median(times) if times else None
    if out:
        res["capture"] = read_capture(out)
        res["stderr_tail"] = p.stderr[-1500:]
        if args.artifacts and save_as:  # the files a reader of the results may want to open
            os.makedirs(args.artifacts, exist_ok=True)
            for pat in ("analysis/decompose_*.csv", "export/memory_viz_*.pickle"):
                for f in glob.glob(os.path.join(res["capture"]["folder"], pat)):
                    kind = "decompose.csv" if "decompose" in pat else "memory_viz.pickle"
                    shutil.copy(f, os.path.join(args.artifacts, save_as + "_" + kind))
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    return res


def compare(res: dict, kind: str) -> dict:
    """HAL bytes of one kind alive at each mark against memory_reserved()."""
    cap = res.get("capture")
    if not cap or len(cap["live_at_step"]) != len(res["steps"]):
        return {"ok": False, "why": "marks missing from the capture"}
    pairs = [(c[kind], s["reserved"]) for c, s in zip(cap["live_at_step"], res["steps"])]
    bad = [(i, h, r) for i, (h, r) in enumerate(pairs) if h != r]
    return {"ok": not bad, "hal_%s_bytes" % kind: [h for h, _ in pairs], "reserved": [r for _, r in pairs],
            "mismatches": bad[:5], "hal_rows": cap["rows"]["HAL"]}


def compare_pta(res: dict, caching: bool, want_viz: bool = False) -> dict:
    """PTA bytes alive (and their peak) at each mark against PyTorch's
    figure: the requested bytes for the caching allocator (its blocks are
    rounded; the tensors' sizes are the ones asked for), memory_allocated()
    for cudaMallocAsync; for the caching allocator, decompose's reserved
    line at the end against the last memory_reserved()."""
    cap = res.get("capture")
    if not cap or len(cap["pta_at_step"]) != len(res["steps"]):
        return {"ok": False, "why": "marks missing from the capture", "error": res.get("error", "")[-500:]}
    cur, peak = ("requested", "max_requested") if caching else ("allocated", "max_allocated")
    pairs = list(zip(cap["pta_at_step"], res["steps"]))
    bad = [(i, c["live"], s[cur]) for i, (c, s) in enumerate(pairs) if c["live"] != s[cur]]
    bad_peak = [(i, c["peak"], s[peak]) for i, (c, s) in enumerate(pairs) if c["peak"] != s[peak]]
    out = {"ok": not bad and not bad_peak, "compared_with": cur, "pta_bytes": [c["live"] for c in cap["pta_at_step"]],
           cur: [s[cur] for s in res["steps"]], "allocated": [s["allocated"] for s in res["steps"]],
           "mismatches": bad[:5], "peak_mismatches": bad_peak[:5], "decompose_cuda0": cap["decompose_cuda0"]}
    last = res["steps"][-1]
    if not os.environ.get("GPUCHECK_SMOKE"):  # (no device lines on a CPU)
        lines = cap["decompose_cuda0"]
        out["requested_end"] = lines.get("requested", [0, None])[1]
        out["ok"] = out["ok"] and out["requested_end"] == last[cur]
        if caching:  # the allocator's segments and what they hold for no tensor
            out["reserved_end"], out["memory_reserved_last"] = lines.get("reserved", [0, None])[1], last["reserved"]
            out["cached_free_end"] = lines.get("cached_free", [0, None])[1]
            out["reserved_minus_requested_last"] = (last["reserved"] - last["requested"]
                                                    if last.get("requested") is not None else None)
            out["ok"] = out["ok"] and out["reserved_end"] == last["reserved"] and \
                out["cached_free_end"] == out["reserved_minus_requested_last"]
    viz = cap.get("memory_viz")
    if want_viz:  # the export for PyTorch's viewer
        out["memory_viz"] = viz
        if viz is None or viz.get("error"):
            out["ok"] = False  # (on a CPU too: the export and its reading must work)
        elif not os.environ.get("GPUCHECK_SMOKE"):
            # Its blocks at the end are the live tensors; every tensor lies in
            # a driver block (a segment): the segments are the HAL blocks alive
            # at the end, PyTorch's (memory_reserved()) and the others'.
            out["hal_device_bytes_end"] = cap["live_at_step"][-1]["device"]
            out["outside_pytorch_end"] = cap["decompose_cuda0"].get("outside_pytorch", [0, None])[1]
            out["ok"] = out["ok"] and viz.get("viewer_reads") is True and viz.get("time_ordered") is True and \
                viz.get("active_bytes") == cap["pta_at_step"][-1]["live"] and \
                viz.get("segments_at_one_address") == 0 and viz.get("segment_bytes") == out["hal_device_bytes_end"] and \
                out["outside_pytorch_end"] is not None and \
                viz.get("segment_bytes") == last["reserved"] + out["outside_pytorch_end"]
    return out


def outside(res: dict) -> int:
    """Driver memory (every kind) not allocated by PyTorch's caching allocator, at the last mark."""
    last = res["capture"]["live_at_step"][-1]
    return sum(last[k] - last["torch_" + k] for k in ("device", "managed", "vmm"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--repo", default=os.path.dirname(here))
    ap.add_argument("--build", default=os.path.join(os.path.dirname(here), "build"))
    ap.add_argument("--out", default=os.path.join(here, "gpu_check.json"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--timeout", type=int, default=150)
    ap.add_argument("--pairs", type=int, default=3, choices=range(1, 11), metavar="1..10",
                    help="bare and driver-layer runs, in turn, for the step time")
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--artifacts", default="", help="copy the default allocator's decompose CSV and memory_viz export here")
    ap.add_argument("--keep", action="store_true", help="keep the captures (removed once read by default)")
    ap.add_argument("--smoke", action="store_true", help="the check's own test on a machine without a GPU: "
                    "the same runs on the CPU, nothing compared")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    for p in (os.path.join(args.build, "bin", "msmemscope"), os.path.join(args.build, "lib", "libmemscope.so")):
        if not os.path.exists(p):
            print("gpu-check: %s is missing: build it first (make build), then carry build/" % p, file=sys.stderr)
            return 2
    try:
        import torch
        has = torch.cuda.is_available()
    except ImportError:
        has = False
    if args.smoke:
        os.environ["GPUCHECK_SMOKE"] = "1"
    elif not has:
        print("gpu-check: no CUDA device (torch.cuda.is_available() is False, or no torch): nothing checked", file=sys.stderr)
        return 2
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="gpucheck_")
    script = os.path.join(work, "train.py")
    with open(script, "w") as f:
        f.write(TRAIN)
    # C stacks tell PyTorch's blocks from other libraries' (only device
    # memory is recorded: --device=cuda leaves the host heap out).
    driver = ["--device=cuda", "--level=kernel", "--events=alloc,free", "--analysis=", "--call-stack=c:32"]
    runs = {
        "bare": run(script, args, "", None),
        "profiler": run(script, args, "", None, profile=True),
        "default": run(script, args, "", driver, oom=True),
        "expandable": run(script, args, "expandable_segments:True", driver),
        "async": run(script, args, "backend:cudaMallocAsync", driver),
        "default_options": run(script, args, "", []),
        # tensor blocks: the operator hooks (level op) read the allocator's history
        "pta_default": run(script, args, "", ["--analysis=decompose", "--export=memory_viz"], save_as="pta_default",
                           nvtx=True),
    }
    if not args.smoke:  # (the same reading as pta_default's: not needed to test the check itself)
        runs["pta_default_python_stacks"] = run(script, args, "", ["--analysis=decompose", "--call-stack=python:16"])
    runs |= {
        "pta_expandable": run(script, args, "expandable_segments:True", ["--analysis=decompose"]),
        "pta_async": run(script, args, "backend:cudaMallocAsync", ["--analysis=decompose"]),
    }
    # The step time of the driver layer alone, bare and traced in turn: a
    # 2 ms step varies from process to process by more than the layer costs.
    pairs = [(runs["bare"], runs["default"])]
    for i in range(2, args.pairs + 1):
        runs["pair%d_bare" % i] = run(script, args, "", None)
        runs["pair%d_driver" % i] = run(script, args, "", driver)
        pairs.append((runs["pair%d_bare" % i], runs["pair%d_driver" % i]))
    pair_ratios = [round(t["median_step_s"] / b["median_step_s"], 3) for b, t in pairs
                   if b.get("median_step_s") and t.get("median_step_s")]
    checks = {
        "hal_device_bytes_equal_reserved_default_allocator": compare(runs["default"], "torch_device"),
        "hal_vmm_bytes_equal_reserved_expandable_segments": compare(runs["expandable"], "torch_vmm"),
        "pta_bytes_equal_requested_default_allocator": compare_pta(runs["pta_default"], True, want_viz=True),
        "pta_bytes_equal_requested_expandable_segments": compare_pta(runs["pta_expandable"], True),
        "pta_bytes_equal_allocated_cudamallocasync": compare_pta(runs["pta_async"], False),
    }
    if "pta_default_python_stacks" in runs:
        checks["pta_bytes_equal_requested_default_allocator_python_stacks"] = compare_pta(runs["pta_default_python_stacks"], True)
    cap = runs["default"].get("capture")
    kern = runs["profiler"].get("kernels")
    if cap and cap["launches_at_step"]:
        ours = cap["launches_at_step"][-1] - cap["launches_at_step"][0]  # steps 1.. as the profiler's
        checks["kernel_launches_vs_profiler"] = {"ok": ours == kern and cap["rows"]["KERNEL_UNNAMED"] == 0,
                                                 "msmemscope": ours, "torch_profiler": kern,
                                                 "unnamed": cap["rows"]["KERNEL_UNNAMED"]}
    else:
        checks["kernel_launches_vs_profiler"] = {"ok": False, "why": "no capture"}
    d = runs["default"]
    reports = (d.get("capture") or {}).get("oom_reports", [])
    checks["oom_row_and_report"] = {"ok": d.get("oom") is True and bool(reports) and all(r["requested"] == 1 << 42 for r in reports)
                                    and (d.get("capture") or {}).get("rows", {}).get("OOM") == len(reports),
                                    "torch_raised": d.get("oom"), "reports": reports}
    got = (runs["pta_default"].get("capture") or {}).get("nvtx_rows")
    want = {"Range_start": args.steps, "Range_end": args.steps, "Mark": args.steps}
    checks["nvtx_ranges_and_marks"] = {"ok": args.smoke or got == want, "rows": got, "want": want}
    checks["device_snapshot_each_step"] = {"ok": args.smoke or (d.get("capture") or {}).get("rows", {}).get("SNAPSHOT_DEVICE") == args.steps,
                                           "rows": (d.get("capture") or {}).get("rows", {}).get("SNAPSHOT_DEVICE")}
    if args.smoke:
        checks["oom_row_and_report"]["ok"] = True  # no device to run out of
    bare = runs["bare"].get("median_step_s")
    ratios = {}
    for k in ("default", "expandable", "async", "default_options", "pta_default", "pta_default_python_stacks",
              "pta_expandable", "pta_async"):
        m = runs.get(k, {}).get("median_step_s")
        if bare and m:
            ratios[k] = round(m / bare, 3)
    a = runs["async"].get("capture")
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": runs["bare"].get("gpu"), "torch": runs["bare"].get("torch"), "cuda": runs["bare"].get("cuda"),
        "python": sys.version.split()[0], "steps": args.steps,
        "checks": checks,
        "step_time_ratio_traced_over_bare": ratios,
        "driver_layer_pairs": {"ok": len(pair_ratios) == args.pairs, "ratios": pair_ratios, "median": statistics.median(pair_ratios) if pair_ratios else None,
                               "bare_median_step_s": [b.get("median_step_s") for b, _ in pairs],
                               "traced_median_step_s": [t.get("median_step_s") for _, t in pairs]},
        "outside_pytorch_bytes_at_last_step": {k: outside(runs[k]) for k in ("default", "expandable", "async")
                                               if runs[k].get("capture") and runs[k]["capture"]["live_at_step"]},
        "async_backend": {"hal_live_at_step": a and [c["device"] for c in a["live_at_step"]],
                          "reserved": [s["reserved"] for s in runs["async"].get("steps", [])]},
        "runs": runs,
        "seconds": round(time.time() - t0, 1),
    }
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    ok = all(c.get("ok") for c in checks.values()) and report["driver_layer_pairs"]["ok"]
    print("gpu-check on %s (torch %s, CUDA %s), %.0f s: %s" % (report["gpu"], report["torch"], report["cuda"],
                                                             report["seconds"], "all exact" if ok else "MISMATCH"))
    for k, c in checks.items():
        print("  %-52s %s" % (k, "ok" if c.get("ok") else "FAILED %s" % {x: y for x, y in c.items() if x != "ok"}))
    print("  step time traced / bare: %s" % ratios)
    print("  driver layer alone, %d pairs: %s" % (len(pair_ratios), pair_ratios))
    for k, r in runs.items():
        if r.get("error"):
            print("  run %s failed (exit %s): %s" % (k, r.get("exit"), r["error"][-400:]))
    print("  results: %s" % args.out)
    if args.smoke:  # the runs and the capture's reading worked (the export's too): that is all a CPU can show
        return 0 if ok and all(not r.get("error") and (k.endswith("bare") or k == "profiler" or r.get("capture"))
                               for k, r in runs.items()) else 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
