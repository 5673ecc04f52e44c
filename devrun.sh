#!/bin/bash
B=./bin/kvtierfs; W=/var/tmp/kvb; mkdir -p $W
for i in 1 2; do timeout 280 $B bench disk --dir $W --blocks 512 2>&1 | tail -8 | tee $OUT/disk-512-$i.txt; done
