#!/bin/bash
# Builds the Hopper experiments here, on a machine with nvcc and no GPU (sm_90a compiles without one); carry the
# binaries to the GPU machine (the device tool's carry: notes/tools/hopper/bin) and run run.sh there.
set -e
cd "$(dirname "$0")"
mkdir -p bin
python3 gen.py  # writes bin/wgmma_gen.h
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a probe.cu -o bin/probe
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Ibin probe_pv.cu -o bin/probe_pv
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Ibin -Xptxas -v fa.cu -o bin/fa 2>&1 | grep -E "spill|error" | sort | uniq -c
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Ibin -DWATCHDOG fa.cu -o bin/fa_watch 2>&1 | grep -E "error" || true
