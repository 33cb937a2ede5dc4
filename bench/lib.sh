# Shell helpers the bench scripts share (sourced).
now_ns() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
# ratios A B: the per-repetition ratios A[i]/B[i] of two space-separated lists, one a line.
ratios() { awk -v a="$1" -v b="$2" 'BEGIN {n = split(a, x, " "); split(b, y, " "); for (i = 1; i <= n; i++) printf "%.4f\n", x[i] / y[i]}'; }
