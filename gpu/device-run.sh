#!/bin/bash
# Issue 6: the gpu package's tests and H2D bench on the accelerator machine.
# Build here (no CUDA needed), then run this there with bin/ carried:
#   CGO_ENABLED=1 go test -tags cuda -c -o bin/gpu.test ./gpu/
#   CGO_ENABLED=1 go build -tags cuda -o bin/h2dbench ./gpu/cmd/h2dbench
#   (device) bash gpu/device-run.sh     # writes env.txt, gpu-test.txt, h2d-dev*.txt to $OUT
set -o pipefail
cd "$(dirname "$0")/.."
{
  echo "== host"; uname -r; ldd --version | head -1; nproc; df -h /dev/shm
  echo "== nvidia-smi"; nvidia-smi
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv
  nvidia-smi topo -m
  echo "== libraries"; ldconfig -p | grep -E 'libcudart|libnvrtc|libcuda\.so'
} 2>&1 | tee $OUT/env.txt
avail=$(df --output=avail -k /dev/shm | tail -1)
if [ "${avail:-0}" -lt 8000000 ]; then mount -o remount,size=16G /dev/shm && df -h /dev/shm | tee -a $OUT/env.txt; fi
if ! ldconfig -p | grep -q 'libnvrtc\.so'; then
  export KVTIERFS_NVRTC=$(find / -xdev -name 'libnvrtc.so.1[0-9]*' 2>/dev/null | grep -v builtins | head -1)
  echo "KVTIERFS_NVRTC=$KVTIERFS_NVRTC" | tee -a $OUT/env.txt
fi
if ! ldconfig -p | grep -q 'libcudart\.so'; then
  export KVTIERFS_CUDART=$(find / -xdev -name 'libcudart.so.1[0-9]*' 2>/dev/null | head -1)
  echo "KVTIERFS_CUDART=$KVTIERFS_CUDART" | tee -a $OUT/env.txt
fi
echo "== go test"
KVTIERFS_REQUIRE_CUDA=1 ./bin/gpu.test -test.v -test.count=1 -test.bench . -test.benchtime 50x 2>&1 | tee $OUT/gpu-test.txt
echo "rc=$?"
ls /dev/shm | grep kvtier && echo "LEFTOVER shm files"
echo "== h2dbench"
./bin/h2dbench --gpu cuda --device 0 --rows 128 --batches 1,8,32 --passes 10 2>&1 | tee $OUT/h2d-dev0.txt
n=$(nvidia-smi -L | wc -l)
for ((d = 1; d < n; d++)); do
  ./bin/h2dbench --gpu cuda --device $d --rows 128 --batches 8 --passes 10 2>&1 | tee $OUT/h2d-dev$d.txt
done
