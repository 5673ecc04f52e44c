#!/bin/bash
# Benchmarks for BENCHMARKS.md on the accelerator machine (not part of the project).
set -x
nproc; free -g | head -2; df -h /tmp /var/tmp | tail -2; uname -r
B=./bin/kvtierfs
W=/var/tmp/kvb; mkdir -p $W
for blocks in 64 512; do
  timeout 400 $B bench disk --dir $W --blocks $blocks 2>&1 | tail -9 | tee $OUT/disk-$blocks.txt
done
timeout 300 $B bench chain --dir $W 2>&1 | tail -25 | tee $OUT/chain.txt
