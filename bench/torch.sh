#!/usr/bin/env bash
# PyTorch overhead (issue 4): one CPU training loop (MLP of three 1024-wide
# layers, batch 256, Adam) bare, under msmemscope with
# events=alloc,free,launch and alloc,free,launch,access, and under
# torch.profiler.profile(profile_memory=True, record_shapes=True). Each mode
# runs ROUNDS times, interleaved; the best median step time of each counts.
# Reports the ratios to bare and the microseconds added per aten operator.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STEPS=${STEPS:-20}
ROUNDS=${ROUNDS:-3}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export PYTHONPATH=$PWD/python MSMEMSCOPE_LIB=$PWD/build/lib/libmemscope.so MSMEMSCOPE_CLI=$PWD/build/bin/msmemscope
run() { # name, command...
	local name=$1; shift
	"$@" 2>/dev/null | tail -1 | sed "s/^{/{\"name\": \"$name\", /" >>"$OUT/results.jsonl"
}
for r in $(seq "$ROUNDS"); do
	run bare "$PY" bench/torch_bench.py bare "$STEPS"
	run launch "$PY" -m msmemscope run --output="$OUT/o$r-l" --collect-mode=deferred --events=alloc,free,launch --analysis= bench/torch_bench.py msmemscope "$STEPS"
	run access "$PY" -m msmemscope run --output="$OUT/o$r-a" --collect-mode=deferred --events=alloc,free,launch,access --analysis= bench/torch_bench.py msmemscope "$STEPS"
	run profiler "$PY" bench/torch_bench.py profiler "$STEPS"
done
"$PY" - "$OUT/results.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = {}
for r in rows:
    if r["name"] not in best or r["median"] < best[r["name"]]["median"]:
        best[r["name"]] = r
ops = max(r["ops"] for r in rows if r["name"] == "bare")
bare = best["bare"]["median"]
print("PyTorch training loop: MLP 3x1024, batch 256, Adam, 1 thread; %d aten operators per step" % ops)
print("%-44s %12s %8s %16s" % ("mode", "ms/step", "ratio", "us added / op"))
labels = {"bare": "bare", "launch": "msmemscope events=alloc,free,launch",
          "access": "msmemscope events=alloc,free,launch,access",
          "profiler": "torch.profiler(profile_memory,record_shapes)"}
for k in ("bare", "launch", "access", "profiler"):
    m = best[k]["median"]
    print("%-44s %12.2f %7.3fx %16.1f" % (labels[k], m * 1e3, m / bare, (m - bare) / ops * 1e6))
PYEOF
