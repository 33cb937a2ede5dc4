# Shell helpers the bench scripts share (sourced).
now_ns() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# ratios A B: the per-repetition ratios A[i]/B[i] of two space-separated lists, one a line.
ratios() { awk -v a="$1" -v b="$2" 'BEGIN {n = split(a, x, " "); split(b, y, " "); for (i = 1; i <= n; i++) printf "%.4f\n", x[i] / y[i]}'; }
# alternate VAR "MODES" REPS LABEL: `run MODE` for each mode in turn, REPS
# rounds, each figure appended to the associative array VAR[MODE].
alternate() {
	local -n acc=$1
	local rep mode ns
	for rep in $(seq "$3"); do
		for mode in $2; do
			ns=$(run "$mode")
			acc[$mode]+="$ns "
			echo "rep=$rep $mode $4=$ns" >&2
		done
	done
}
# medianof "LIST": the median of a space-separated list.
medianof() { echo $1 | tr ' ' '\n' | median; }
# ratio_range A B: the lowest and highest per-repetition ratio A[i]/B[i], "lo–hi".
ratio_range() { ratios "$1" "$2" | sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {printf "%.2f–%.2f", lo, hi}'; }
