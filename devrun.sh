#!/bin/bash
cd sync
for r in 1 2; do
  echo "== dd8aaaf round $r"; timeout 100 ../bin/sync-dd8aaaf.test -test.run XXX -test.bench Mirror -test.benchtime 5x 2>&1 | grep Bench
  echo "== new round $r"; timeout 100 ../bin/sync.test -test.run XXX -test.bench Mirror -test.benchtime 5x 2>&1 | grep Bench
done | tee $OUT/sync-ab.txt
