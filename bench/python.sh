#!/usr/bin/env bash
# make bench, the Python workload (issue 3): build and drop 1 M small objects
# with PYTHONMALLOC=malloc (every object a malloc/free), bare, traced, traced
# with python:16 stacks, and under memray (plain and --native), alternating,
# medians of the loop time the script measures itself. Appends to
# bench/results.md.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
ROOT=$PWD
LIB=$ROOT/build/lib/libmemscope.so
PY=${PYTHON:-$ROOT/.venv/bin/python}
REPS=${REPS:-5}
WORK=$ROOT/bench/work-py
OUT=${RESULTS:-$ROOT/bench/results.md}
rm -rf "$WORK" && mkdir -p "$WORK"
cat >"$WORK/objects.py" <<'PY'
import time

def build_and_drop(n):
    objs = [str(i) * 2 for i in range(n)]  # 1 M small str objects, each a malloc
    del objs                               # ... and a free

t0 = time.perf_counter_ns()
build_and_drop(1_000_000)
print("loop_ns", time.perf_counter_ns() - t0)
PY
export PYTHONMALLOC=malloc

run() {
	local mode=$1 out
	rm -rf "$WORK/cap" "$WORK"/*.bin
	case $mode in
	bare) out=$("$PY" "$WORK/objects.py") ;;
	traced | py16)
		local cfg='{"output":"'$WORK/cap'","analysis":[]}'
		[ "$mode" = py16 ] && cfg='{"output":"'$WORK/cap'","analysis":[],"python_stack":true,"python_stack_depth":16}'
		out=$(MSMEMSCOPE_HOOK=heap=1,cstack=0 MSMEMSCOPE_RUN_ID=bench MSMEMSCOPE_CONFIG="$cfg" \
			LD_PRELOAD=$LIB "$PY" "$WORK/objects.py")
		;;
	memray) out=$("$PY" -m memray run -q -f -o "$WORK/m.bin" "$WORK/objects.py") ;;
	memray_native) out=$("$PY" -m memray run -q --native -f -o "$WORK/m.bin" "$WORK/objects.py") ;;
	esac
	echo "$out" | awk '/loop_ns/ {print $2}'
}

modes="bare traced py16 memray memray_native"
declare -A loops
alternate loops "$modes" "$REPS" loop_ns
# Whole command: `msmemscope python script` with the default options (CSV
# written, leak scan at exit, leaks analysis), and with the deepest Python
# stacks (memray records whole stacks), against `memray run` (its capture
# written) and the bare script, alternating.
CLI=$ROOT/build/bin/msmemscope
WREPS=${WREPS:-3}
bw="" mw="" dw="" rw=""
for rep in $(seq "$WREPS"); do
	t0=$(now_ns); "$PY" "$WORK/objects.py" >/dev/null; bw+="$(($(now_ns) - t0)) "
	rm -rf "$WORK/cli"; sync; t0=$(now_ns)
	"$CLI" --output="$WORK/cli" "$PY" "$WORK/objects.py" >/dev/null 2>&1
	mw+="$(($(now_ns) - t0)) "
	rm -rf "$WORK/cli"; sync; t0=$(now_ns)
	"$CLI" --call-stack=python:1000 --output="$WORK/cli" "$PY" "$WORK/objects.py" >/dev/null 2>&1
	dw+="$(($(now_ns) - t0)) "
	rm -f "$WORK/m.bin"; sync; t0=$(now_ns)
	"$PY" -m memray run -q -f -o "$WORK/m.bin" "$WORK/objects.py" >/dev/null
	rw+="$(($(now_ns) - t0)) "
	echo "whole rep=$rep bare/ms/ms-deep/memray ns: ${bw% } | ${mw% } | ${dw% } | ${rw% }" >&2
done
rows=$(grep -o '"events_written": [0-9]*' "$(ls -d "$WORK"/cli/msmemscope_*)/config.json" | awk '{print $2}')
{
	echo
	echo "## Python workload (issue 3)"
	echo
	echo "Build and drop 1 M small \`str\` objects with \`PYTHONMALLOC=malloc\`, $REPS repetitions each running"
	echo "every mode in turn, the script's own loop time (\`$("$PY" -c 'import sys;print(sys.version.split()[0])')\`, memray $("$PY" -c 'import memray;print(memray.__version__)'))."
	echo "A ratio is the median of the per-repetition ratios to the bare run of the same repetition."
	echo
	echo "| mode | loop ms (median) | ratio to bare (median, range) |"
	echo "|---|---|---|"
	for mode in $modes; do
		m=$(medianof "${loops[$mode]}")
		r=$(ratios "${loops[$mode]}" "${loops[bare]}" | median)
		rr=$(ratio_range "${loops[$mode]}" "${loops[bare]}")
		awk -v mode="$mode" -v m="$m" -v r="$r" -v rr="$rr" 'BEGIN {printf "| %s | %.0f | **%.2f×** (%s) |\n", mode, m/1e6, r, rr}'
	done
	echo
	echo "traced = msmemscope recording alloc/free; py16 = with \`--call-stack=python:16\`;"
	echo "memray = \`memray run\`; memray_native = \`memray run --native\`."
	echo
	echo "Whole command, start to end ($WREPS repetitions alternating, medians of per-repetition ratios):"
	echo "\`msmemscope python script\` with the default options ($rows CSV rows, leak scan, leaks analysis), and with"
	echo "\`--call-stack=python:1000\` (deep), against the bare script and \`memray run\` (capture written)."
	echo
	echo "| msmemscope whole / bare | deep whole / bare | memray run whole / bare | msmemscope / memray | deep / memray |"
	echo "|---|---|---|---|---|"
	awk -v m="$(ratios "$mw" "$bw" | median)" -v d="$(ratios "$dw" "$bw" | median)" -v r="$(ratios "$rw" "$bw" | median)" \
		-v v="$(ratios "$mw" "$rw" | median)" -v dv="$(ratios "$dw" "$rw" | median)" \
		'BEGIN {printf "| %.1f× | %.1f× | %.1f× | %.2f× | %.2f× |\n", m, d, r, v, dv}'
} >>"$OUT"
rm -rf "$WORK"
