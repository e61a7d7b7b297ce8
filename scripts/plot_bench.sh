#!/usr/bin/env bash
# Draws the bench's figures from its CSV (meshwit-bench --csv FILE): docs/reduce.png (all-reduce
# bus bandwidth against message size for each device count, with the memory-bandwidth bound) and
# docs/scaling.png (GPT-2 tokens/s and the share of the step spent in collectives over 1, 2, 4
# devices) and docs/parallel.png (data, ZeRO-1, tensor and data x tensor parallelism, recomputation
# and FSDP on llm.c's GPT-2: tokens/s and
# what one device holds). Needs gnuplot (Debian: gnuplot-nox).
# Usage: scripts/plot_bench.sh BENCH.csv [OUTDIR]
set -euo pipefail
csv="$1"
out="${2:-docs}"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# column NAME: the index of a header field.
col() { head -n 1 "$csv" | tr ',' '\n' | grep -n -x "$1" | cut -d: -f1; }

c_case=$(col case) c_dev=$(col devices)
if grep -q '^reduce,' "$csv"; then
    c_bytes=$(col bytes) c_bus=$(col busbw_gbps) c_bound=$(col bound_gbps)
    plots=()
    for dev in $(awk -F, -v c="$c_case" -v d="$c_dev" '$c == "reduce" { print $d }' "$csv" |
                 sort -u); do
        awk -F, -v c="$c_case" -v d="$c_dev" -v b="$c_bytes" -v u="$c_bus" -v dev="$dev" \
            '$c == "reduce" && $d == dev { print $b, $u }' "$csv" > "$tmp/$dev.dat"
        plots+=("'$tmp/$dev.dat' using 1:2 with linespoints title '$dev'")
    done
    bound=$(awk -F, -v c="$c_case" -v d="$c_dev" -v k="$c_bound" \
        '$c == "reduce" && $d == "cpu:2" && $k != "" { print $k; exit }' "$csv")
    [ -n "$bound" ] && plots+=("$bound * 2 * (2 - 1) / 2 with lines dashtype 2 title 'bound, 2 devices (bus)'")
    gnuplot <<GP
set terminal png size 900,500
set output '$out/reduce.png'
set title 'meshwit shared-memory all-reduce (bus bandwidth = algbw * 2(P-1)/P)'
set logscale x 2
set xtics ('4B' 4, '64B' 64, '1KB' 1024, '16KB' 16384, '256KB' 262144, '4MB' 4194304, '64MB' 67108864)
set xlabel 'message size'
set ylabel 'GB/s'
set key left top
set grid
plot $(IFS=,; echo "${plots[*]}")
GP
    echo "wrote $out/reduce.png"
fi
if grep -q '^scaling,' "$csv"; then
    c_tps=$(col tokens_per_s) c_share=$(col reduce_share)
    awk -F, -v c="$c_case" -v d="$c_dev" -v t="$c_tps" -v s="$c_share" \
        '$c == "scaling" { print $d, $t, 100 * $s }' "$csv" > "$tmp/scaling.dat"
    gnuplot <<GP
set terminal png size 900,500
set output '$out/scaling.png'
set title 'GPT-2 tiny, global batch 8 x 64: throughput and time in collectives'
set style data histograms
set style fill solid 0.6 border -1
set boxwidth 0.6
set ylabel 'tokens/s'
set y2label 'collectives, % of step'
set y2tics
set ytics nomirror
set yrange [0:*]
set y2range [0:100]
set grid ytics
plot '$tmp/scaling.dat' using 2:xtic(1) title 'tokens/s', \
     '' using 0:3 axes x1y2 with linespoints lw 2 title 'collectives %'
GP
    echo "wrote $out/scaling.png"
fi
if grep -q '^parallel,' "$csv"; then
    c_mode=$(col mode) c_tps=$(col tokens_per_s) c_p=$(col param_mb) c_g=$(col grad_mb)
    c_o=$(col optimizer_mb) c_a=$(col activation_mb) c_model=$(col model)
    # llm.c's GPT-2 only: the GPT-2 124M rows (model gpt2-124m) are of another scale.
    awk -F, -v c="$c_case" -v m="$c_mode" -v d="$c_dev" -v t="$c_tps" -v p="$c_p" -v g="$c_g" \
        -v o="$c_o" -v a="$c_a" -v k="${c_model:-0}" \
        '$c == "parallel" && (k == 0 || $k != "gpt2-124m") { printf "\"%s\\n%s\" %s %s %s %s %s\n", $m, $d, $t, $p, $g, $o, $a }' \
        "$csv" > "$tmp/parallel.dat"
    gnuplot <<GP
set terminal png size 1200,1000
set output '$out/parallel.png'
set multiplot layout 2,1 title "llm.c's GPT-2 split over devices: data, ZeRO-1, tensor, data x tensor, recomputation, FSDP"
set style data histograms
set style fill solid 0.6 border -1
set boxwidth 0.7
set xtics font ',9' rotate by -35 left
set bmargin 7
set grid ytics
set yrange [0:*]
set ylabel 'tokens/s'
set key off
plot '$tmp/parallel.dat' using 2:xtic(1) title 'tokens/s'
set style histogram rowstacked
set ylabel 'MB on device 0'
set key outside right top
plot '$tmp/parallel.dat' using 3:xtic(1) title 'parameters', '' using 4 title 'gradients', \
     '' using 5 title 'optimizer state', '' using 6 title 'activations'
unset multiplot
GP
    echo "wrote $out/parallel.png"
fi
