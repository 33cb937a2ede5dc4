#!/usr/bin/env python3
"""Renders make gpu-check's JSON (bench/gpu_check.json, kept from the last
run on a GPU) as the CUDA section of bench/results.md; make bench appends
it, so the figures survive a run on a machine without a GPU."""
import json
import os
import sys

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_check.json")
print("## CUDA on a real GPU (issue 21, `make gpu-check`)\n")
if not os.path.exists(path):
    print("Not run on a GPU yet: `make gpu-check` on a machine with an NVIDIA GPU writes %s.\n" % os.path.basename(path))
    sys.exit(0)
r = json.load(open(path))
print("Run %s on %s, PyTorch %s, CUDA %s, Python %s: an MLP (1024-4096-4096-512) trained with Adam, "
      "batch 256, %d steps, under each of PyTorch's allocators; the check itself took %s s.\n"
      % (r["date"], r["gpu"], r["torch"], r["cuda"], r["python"], r["steps"], r["seconds"]))
print("| check | result | figures |\n|---|---|---|")
for k, c in r["checks"].items():
    fig = {x: y for x, y in c.items() if x not in ("ok", "mismatches", "peak_mismatches", "decompose_cuda0", "memory_viz")}
    for x, y in list(fig.items()):
        if isinstance(y, list) and len(y) > 3 and all(isinstance(v, int) for v in y):
            fig[x] = "%d values, first %s, last %s" % (len(y), y[0], y[-1])
    print("| %s | %s | %s |" % (k.replace("_", " "), "**exact**" if c.get("ok") else "**differs**",
                                json.dumps(fig).replace("|", "/")))
print()
rt = r["step_time_ratio_traced_over_bare"]
bare = r["runs"]["bare"].get("median_step_s")
print("Step time (median of steps 1..%d; bare %.2f ms), traced over bare: default allocator %s, expandable segments %s, "
      "cudaMallocAsync %s with the driver layer alone (`--device=cuda --level=kernel --events=alloc,free "
      "--call-stack=c:32`); %s with msmemscope's default options (host heap and operator hooks too).\n"
      % (r["steps"] - 1, (bare or 0) * 1e3, *("%.2f×" % rt[k] if k in rt else "n/a" for k in ("default", "expandable", "async", "default_options"))))
o = {}
for k in ("default", "expandable", "async"):
    cap = r["runs"].get(k, {}).get("capture")
    if cap and cap["live_at_step"]:
        last = cap["live_at_step"][-1]
        o[k] = sum(last[x] - last["torch_" + x] for x in ("device", "managed", "vmm"))
if o:
    print("Driver memory outside PyTorch's caching allocator at the last step (other libraries' cudaMalloc): %s.\n"
          % ", ".join("%s %.1f MiB" % (k, v / 2**20) for k, v in o.items()))
pairs = r.get("driver_layer_pairs")
if pairs and pairs.get("ratios"):
    print("The driver layer alone, bare and traced in turn (%d pairs of processes): step time traced over bare %s, "
          "median **%.2f×** (bare steps %s ms)." % (len(pairs["ratios"]), ", ".join("%.2f×" % x for x in pairs["ratios"]),
          pairs["median"], ", ".join("%.2f" % (x * 1e3) for x in pairs["bare_median_step_s"] if x)) + "\n")
pta = {k: rt[k] for k in ("pta_default", "pta_default_python_stacks", "pta_expandable", "pta_async") if k in rt}
if pta:
    print("With the operator hooks on (the tensor blocks: `--analysis=decompose`, default options otherwise): %s. "
          "Their cost is the hooks' per operator (a Python dispatch mode), about a hundred operators in a 2 ms step.\n"
          % ", ".join("%s %.2f×" % (k[4:].replace("_", " "), v) for k, v in pta.items()))
dec = r["checks"].get("pta_bytes_equal_requested_default_allocator", {}).get("decompose_cuda0")
if dec:
    print("`--analysis=decompose`'s lines for cuda:0 (default allocator; bytes, peak / end):\n")
    print("| line | peak | end |\n|---|---|---|")
    for name, (peak, end) in dec.items():
        print("| %s | %d | %d |" % (name.replace("|", "/"), peak, end))
    print()
viz = r["checks"].get("pta_bytes_equal_requested_default_allocator", {}).get("memory_viz")
if viz:
    print("`--export=memory_viz` of that run, read by PyTorch's own `torch.cuda._memory_viz` (trace and segsum): %s.\n"
          % json.dumps(viz))
print("Whole commands (s): %s.\n" % ", ".join("%s %s" % (k, v.get("whole_seconds")) for k, v in r["runs"].items()))
if not any(k.startswith("pta_") for k in r["checks"]):
    print("Not compared on a GPU yet: PTA rows of CUDA tensor blocks and decompose's device lines (this JSON "
          "is from a check that predates them; the current bench/gpu_check.py compares them with "
          "PyTorch's requested bytes and their peak, and memory_reserved()).\n")
