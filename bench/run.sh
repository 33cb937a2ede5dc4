#!/usr/bin/env bash
# make bench: the malloc/free microbenchmark (issue 2) — bare, under
# msmemscope without stacks, with --call-stack=c:16, and under heaptrack, in
# one run, alternating, several repetitions; medians and ratios to bare go to
# bench/results.md.
#
# Loop time is the program's own measurement of its allocation loop (every
# event reaches the spool: the library drains at exit before the files are
# written). Repetitions preload the library directly, as the CLI does, so that
# a 40 M-event CSV is not written each time; the whole-command figure comes
# from one real `msmemscope` run per thread count, CSV included.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$(dirname "$0")/.."
ROOT=$PWD
LIB=$ROOT/build/lib/libmemscope.so
CLI=$ROOT/build/bin/msmemscope
PAIRS=${PAIRS:-20000000}
REPS=${REPS:-7}
WORK=$ROOT/bench/work
OUT=${RESULTS:-$ROOT/bench/results.md}
rm -rf "$WORK" && mkdir -p "$WORK"
gcc -O2 -g -fno-omit-frame-pointer -o "$WORK/malloc_bench" bench/malloc_bench.c -lpthread


# run MODE THREADS -> prints loop_ns; leaves spool size in $WORK/last_spool
run() {
	local mode=$1 threads=$2 out
	rm -rf "$WORK/cap" "$WORK/ht" && mkdir -p "$WORK/cap" "$WORK/ht"
	# Each run starts with nothing of the last one's still going to disk
	# (heaptrack's trace, a deleted spool's blocks): a run's own loop time is
	# measured, and writeback left by another would count against it.
	sync
	case $mode in
	bare) out=$("$WORK/malloc_bench" "$PAIRS" "$threads") ;;
	ms | ms_c16)
		local hook="heap=1,cstack=0"
		[ "$mode" = ms_c16 ] && hook="heap=1,cstack=16"
		out=$(MSMEMSCOPE_HOOK=$hook MSMEMSCOPE_RUN_ID=bench \
			MSMEMSCOPE_CONFIG="{\"output\":\"$WORK/cap\",\"analysis\":[]}" \
			LD_PRELOAD=$LIB "$WORK/malloc_bench" "$PAIRS" "$threads")
		stat -c %s "$WORK"/cap/msmemscope_*/spool/spool.bin >"$WORK/last_spool_$mode"
		;;
	heaptrack) out=$(cd "$WORK/ht" && heaptrack "$WORK/malloc_bench" "$PAIRS" "$threads" 2>/dev/null | grep loop_ns) ;;
	esac
	echo "$out" | awk '/loop_ns/ {print $2}'
}

# Each repetition runs the bare program twice, before and after the two
# msmemscope modes; its bare time is the geometric mean of the two, so that
# one lucky or unlucky bare run (this VM's speed swings by 2x within seconds)
# does not make the repetition's ratios.
modes="bare ms ms_c16 heaptrack"
declare -A loops
for threads in 1 2; do
	for rep in $(seq "$REPS"); do
		for mode in bare ms ms_c16 bare2 heaptrack; do
			ns=$(run "${mode%2}" "$threads")
			echo "threads=$threads rep=$rep $mode loop_ns=$ns" >&2
			case $mode in
			bare) b1=$ns ;;
			bare2) loops[bare,$threads]+="$(awk -v a="$b1" -v b="$ns" 'BEGIN {printf "%.0f", sqrt(a*b)}') " ;;
			*) loops[$mode,$threads]+="$ns " ;;
			esac
		done
	done
done

# Whole command (start-up, recording, the exit's leak scan, converting to
# CSV, the leaks analysis: everything a user waits for with the default
# options) against the bare program and heaptrack's whole command,
# alternating, WREPS repetitions; and CSV rows/s of one conversion. WPAIRS
# is smaller than PAIRS: its 10 M rows (1.4 GB of CSV) fit this machine's
# page cache, where 40 M rows (5.5 GB) would time the disk (README, "Time
# to answer").
WREPS=${WREPS:-3}
WPAIRS=${WPAIRS:-5000000}
declare -A whole whole_ht whole_vs rows_s spool_bpe
# whole_run NAME BARE-CMD...: one repetition of bare, msmemscope and heaptrack
# whole commands, appended to bw, mw and hw.
whole_run() {
	local t0
	t0=$(now_ns)
	"$@" >/dev/null
	bw+="$(($(now_ns) - t0)) "
	rm -rf "$WORK/cli" && sync
	t0=$(now_ns)
	"$CLI" --output="$WORK/cli" "$@" >/dev/null 2>&1
	mw+="$(($(now_ns) - t0)) "
	rm -rf "$WORK/ht" && mkdir -p "$WORK/ht" && sync
	t0=$(now_ns)
	(cd "$WORK/ht" && heaptrack "$@" >/dev/null 2>&1)
	hw+="$(($(now_ns) - t0)) "
}
for threads in 1 2; do
	bw="" mw="" hw=""
	for rep in $(seq "$WREPS"); do
		whole_run "$WORK/malloc_bench" "$WPAIRS" "$threads"
		echo "threads=$threads whole rep=$rep ns: bare ${bw}/ msmemscope ${mw}/ heaptrack ${hw}" >&2
	done
	whole[$threads]=$(ratios "$mw" "$bw" | median)
	whole_ht[$threads]=$(ratios "$hw" "$bw" | median)
	whole_vs[$threads]=$(ratios "$mw" "$hw" | median)
	dir=$(ls -d "$WORK"/cli/msmemscope_*)
	rows=$(grep -o '"events_written": [0-9]*' "$dir/config.json" | awk '{print $2}')
	events=$(grep -o '"events_recorded": [0-9]*' "$dir/config.json" | awk '{print $2}')
	spool=$(stat -c %s "$dir/spool/spool.bin")
	spool_bpe[$threads]=$(awk -v s="$spool" -v e="$events" 'BEGIN {printf "%.1f", s/e}')
	rm -f "$dir"/dump/*.csv "$dir"/analysis/*
	t0=$(now_ns)
	"$CLI" --input="$dir" >/dev/null 2>&1
	conv=$(($(now_ns) - t0))
	rows_s[$threads]=$(awk -v r="$rows" -v t="$conv" 'BEGIN {printf "%.0f", r/(t/1e9)}')
	rm -rf "$WORK/cli" "$WORK/ht"
done

# Thousands of short-lived threads whose blocks other threads free.
gcc -O2 -g -fno-omit-frame-pointer -o "$WORK/short_threads" bench/short_threads.c -lpthread
STHREADS=${STHREADS:-2000}
bw="" mw="" hw=""
for rep in $(seq "$WREPS"); do
	whole_run "$WORK/short_threads" "$STHREADS" 200
	echo "short threads whole rep=$rep ns: bare ${bw}/ msmemscope ${mw}/ heaptrack ${hw}" >&2
done
st_ms=$(ratios "$mw" "$bw" | median)
st_ht=$(ratios "$hw" "$bw" | median)
st_vs=$(ratios "$mw" "$hw" | median)
rm -rf "$WORK/cli" "$WORK/ht"

{
	echo "# msmemscope benchmarks"
	echo
	echo "Generated by \`make bench\` on $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)."
	echo
	echo "## malloc/free microbenchmark (issue 2)"
	echo
	echo "$PAIRS pairs of mixed sizes (8–1031 B), $REPS repetitions, each running every mode in turn;"
	echo "loop time is the program's own measurement of its allocation loop, with every event in the"
	echo "spool. The speed of this virtual machine drifts by up to 2× within minutes (the bare loop alone"
	echo "ranged as shown), so a ratio is the median of the per-repetition ratios: each run divided by"
	echo "the bare time of the same repetition, seconds apart; their range is shown too. A repetition"
	echo "runs the bare program twice, before and after the msmemscope modes, and its bare time is the"
	echo "geometric mean of the two."
	echo
	echo "| threads | mode | loop ms (median, range) | ratio to bare (median, range) | ratio / heaptrack's |"
	echo "|---|---|---|---|---|"
	for threads in 1 2; do
		b=${loops[bare,$threads]}
		h=${loops[heaptrack,$threads]}
		for mode in $modes; do
			m=${loops[$mode,$threads]}
			lm=$(echo $m | tr ' ' '\n' | median)
			lr=$(echo $m | tr ' ' '\n' | sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.0f–%.0f", lo/1e6, hi/1e6}')
			r=$(ratios "$m" "$b" | median)
			rr=$(ratios "$m" "$b" | sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.2f–%.2f", lo, hi}')
			rh=$(ratios "$m" "$h" | median)
			awk -v t="$threads" -v mode="$mode" -v lm="$lm" -v lr="$lr" -v r="$r" -v rr="$rr" -v rh="$rh" \
				'BEGIN {printf "| %s | %s | %.0f (%s) | **%.2f×** (%s) | %.2f |\n", t, mode, lm/1e6, lr, r, rr, rh}'
		done
	done
	echo
	echo "Whole command: \`msmemscope prog\` with the default options (CSV written, leak scan at exit, leaks"
	echo "analysis) and \`heaptrack prog\` (its trace written), start to end, against the bare program; $WPAIRS pairs"
	echo "($((2 * WPAIRS / 1000000)) M rows, whose CSV fits the page cache), $WREPS repetitions alternating, medians of"
	echo "the per-repetition ratios. The conversion alone (\`--input=\` on the capture, defaults) gives the rows/s;"
	echo "per core divides them by the $(nproc) cores it runs on."
	echo
	echo "| threads | msmemscope whole / bare | heaptrack whole / bare | msmemscope / heaptrack | spool bytes/event | conversion rows/s | rows/s per core |"
	echo "|---|---|---|---|---|---|---|"
	for threads in 1 2; do
		awk -v t="$threads" -v m="${whole[$threads]}" -v h="${whole_ht[$threads]}" -v v="${whole_vs[$threads]}" -v s="${spool_bpe[$threads]}" -v r="${rows_s[$threads]}" -v c="$(nproc)" \
			'BEGIN {printf "| %s | %.1f× | %.1f× | %.2f× | %s | %s | %.0f |\n", t, m, h, v, s, r, r/c}'
	done
	echo
	echo "$STHREADS short-lived threads, 8 at a time, each allocating 200 blocks and freeing the 200 the thread"
	echo "before it left ($((STHREADS * 200)) blocks, nearly all freed by another thread), whole commands as above:"
	echo
	echo "| msmemscope whole / bare | heaptrack whole / bare | msmemscope / heaptrack |"
	echo "|---|---|---|"
	awk -v m="$st_ms" -v h="$st_ht" -v v="$st_vs" 'BEGIN {printf "| %.1f× | %.1f× | %.2f× |\n", m, h, v}'
	echo
	echo "Modes: bare = the program alone; ms = msmemscope recording alloc/free without stacks;"
	echo "ms_c16 = with \`--call-stack=c:16\`; heaptrack = \`heaptrack prog\` (Debian 1.4)."
} >"$OUT"

# Rotating logs (issue 6): a 10 M-event log of the same program, parsed in
# parallel with 1 and 2 goroutines.
go build -o "$WORK/logparse" ./bench/logparse
rm -rf "$WORK/rot"
"$CLI" --analysis= --log-mode=rotate --log-files=1000 --log-file-mb=2 --output="$WORK/rot" \
	"$WORK/malloc_bench" 5000000 1 >/dev/null 2>&1
read -r _ files _ events _ bpe _ r1 _ r2 _ sp < <("$WORK/logparse" "$(ls -d "$WORK"/rot/msmemscope_*)")
{
	echo
	echo "## Rotating logs and the parallel timeline (issue 6)"
	echo
	echo "The microbenchmark (5 M pairs, 1 thread) under \`--log-mode=rotate --log-file-mb=2\`: $files zstd logs."
	echo
	echo "| events | bytes/event | parse events/s, 1 goroutine | 2 goroutines | speed-up |"
	echo "|---|---|---|---|---|"
	echo "| $events | $bpe | $r1 | $r2 | ${sp}× |"
} >>"$OUT"

# Rotate mode bounded (issue 18): RPAIRS pairs into 3 logs of 20 MiB, the
# program preloaded as the CLI does (its loop and peak RSS), its disk use at
# the end; then the CLI converting the logs (--input=, the default leaks
# analysis) with its peak RSS.
RPAIRS=${RPAIRS:-50000000}
rm -rf "$WORK/rot"
rb=$("$WORK/malloc_bench" "$RPAIRS" 1 | awk '/loop_ns/ {print $2}')
rbare_rss=$( { /usr/bin/time -f "%M" "$WORK/malloc_bench" 1000 1 >/dev/null; } 2>&1 | tail -1)
rl=$( { MSMEMSCOPE_HOOK=heap=1,cstack=0 MSMEMSCOPE_RUN_ID=bench \
	MSMEMSCOPE_CONFIG="{\"output\":\"$WORK/rot\",\"analysis\":[],\"log_mode\":\"rotate\",\"log_files\":3,\"log_file_mb\":20}" \
	/usr/bin/time -f "rss %M" env LD_PRELOAD="$LIB" "$WORK/malloc_bench" "$RPAIRS" 1; } 2>&1)
rloop=$(echo "$rl" | awk '/loop_ns/ {print $2}')
rrss=$(echo "$rl" | awk '/^rss/ {print $2}')
rdir=$(ls -d "$WORK"/rot/msmemscope_*)
rdisk=$(du -sk "$rdir" | cut -f1)
/usr/bin/time -o "$WORK/rconv" -f "rss %M s %e" "$CLI" --input="$rdir" >/dev/null 2>&1
rconv=$(tail -1 "$WORK/rconv")
{
	echo
	echo "## Rotate mode bounded (issue 18)"
	echo
	echo "The microbenchmark, $RPAIRS pairs, 1 thread, under \`--log-mode=rotate --log-files=3 --log-file-mb=20\`"
	echo "(bound: 60 MiB): no dump is written at exit."
	echo
	echo "| loop / bare | program peak RSS (bare: ${rbare_rss} KB) | capture on disk at the end | converting the logs (--input=, leaks): peak RSS, seconds |"
	echo "|---|---|---|---|"
	awk -v l="$rloop" -v b="$rb" -v r="$rrss" -v d="$rdisk" -v c="$rconv" \
		'BEGIN {split(c, x, " "); printf "| %.1f× | %d KB | %.1f MiB | %d KB, %s s |\n", l/b, r, d/1024, x[2], x[4]}'
} >>"$OUT"
rm -rf "$WORK/rot"

# The same with a large live set: 1 M blocks live while 5 M pairs go by
# (the rotator keeps every live block, to repeat it in each new log).
gcc -O2 -o "$WORK/live_blocks" bench/live_blocks.c
lbare=$( { /usr/bin/time -f "%M" "$WORK/live_blocks" 1000000; } 2>&1 | tail -1)
lrot=$( { MSMEMSCOPE_HOOK=heap=1,cstack=0 MSMEMSCOPE_RUN_ID=bench \
	MSMEMSCOPE_CONFIG="{\"output\":\"$WORK/rot\",\"analysis\":[],\"log_mode\":\"rotate\",\"log_files\":3,\"log_file_mb\":20}" \
	/usr/bin/time -f "%M" env LD_PRELOAD="$LIB" "$WORK/live_blocks" 1000000; } 2>&1 | tail -1)
{
	echo
	echo "With 1 M blocks of 32 B live while 5 M pairs go by (bench/live_blocks.c), the same options:"
	echo "peak RSS bare ${lbare} KB, in rotate mode ${lrot} KB: **+$(( (lrot - lbare) / 1024 )) MB** (the bound: +64 MB)."
} >>"$OUT"
rm -rf "$WORK/rot"
cat "$OUT"
rm -rf "$WORK"
