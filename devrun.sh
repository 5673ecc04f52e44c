#!/bin/bash
W=/var/tmp/kvb; mkdir -p $W
for r in 1 2; do
 for b in kvtierfs kv-nostage; do echo "== $b round $r"; timeout 140 ./bin/$b bench disk --dir $W --blocks 384 2>&1 | grep -E "load,|reload|store \(" | grep -v "^load\|^store\|^reload"; done
done | tee $OUT/stagingab.txt
