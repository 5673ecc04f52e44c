#!/bin/bash
B=./bin/kvtierfs; W=/var/tmp/kvb; mkdir -p $W
timeout 200 $B bench multinode --row-bytes 8601600 --dir $W 2>&1 | grep -E "load throughput|identical|seconds|errors" | tee $OUT/multinode.txt
cd sync && timeout 200 ../bin/sync.test -test.run XXX -test.bench Mirror -test.benchtime 5x -test.count 2 2>&1 | grep Bench | tee $OUT/syncbench.txt
