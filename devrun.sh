#!/bin/bash
B=./bin/kvtierfs; W=/var/tmp/kvb; mkdir -p $W
timeout 250 $B bench multinode --row-bytes 8601600 --dir $W 2>&1 | tail -40 | tee $OUT/multinode.txt
timeout 120 $B bench multinode --row-bytes 8601600 --dir $W --gpu cuda --sync on 2>&1 | grep -i "identical\|GB/s\|gpu" | tee $OUT/multinode-cuda.txt
