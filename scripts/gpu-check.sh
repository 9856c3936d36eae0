#!/bin/sh
# gpu-check.sh - the device checks in one run, for a machine with an NVIDIA
# GPU: build with the CUDA backends required, run the CUDA tests (they skip
# without a device, so the report says whether they really ran), and write
# a report.
#
#   scripts/gpu-check.sh [REPORT]     (default: gpu-check-report.txt)
#
# Then the device benchmarks (llmem bench device: the pool and cuda-vmm
# against cudaMalloc and cudaMallocAsync, KV append on the device, swap
# bandwidth to pinned memory), unless the tests failed. It takes a few
# minutes on an H100/H200-class machine (the build is most of it; QUICK=1
# shortens the benchmarks).
set -u
REPORT=${1:-gpu-check-report.txt}
BUILD=${BUILD:-build-gpu}
JOBS=$(nproc 2>/dev/null || echo 2)
start=$(date +%s)
{
    echo "llmem gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $JOBS CPUs"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max \
            --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    else
        echo "gpu: nvidia-smi not found"
    fi
    if [ -x /usr/local/cuda/bin/nvcc ]; then
        echo "toolkit: $(/usr/local/cuda/bin/nvcc --version | tail -n 1)"
    fi
} > "$REPORT"

mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMEM_CUDA=ON -DLLMEM_WERROR=ON > "$BUILD/configure.log" 2>&1
crc=$?
grep -E '^-- llmem:' "$BUILD/configure.log" >> "$REPORT"
if [ $crc -ne 0 ]; then
    tail -n 20 "$BUILD/configure.log" >> "$REPORT"
    echo "FAILED: configure with LLMEM_CUDA=ON (see $REPORT)" | tee -a "$REPORT"
    exit 1
fi
if ! cmake --build "$BUILD" -j"$JOBS" --target test_cuda test_cuda_absent llmem_tool > "$BUILD/build.log" 2>&1; then
    tail -n 40 "$BUILD/build.log" >> "$REPORT"
    echo "FAILED: build (see $REPORT)" | tee -a "$REPORT"
    exit 1
fi
echo "--- CUDA tests" >> "$REPORT"
(cd "$BUILD" && ctest --output-on-failure -R 'test_cuda' -V) > "$BUILD/cuda-tests.log" 2>&1
rc=$?
sed 's/^[0-9]*: //' "$BUILD/cuda-tests.log" |
    grep -E '^\[ *(RUN|OK|SKIPPED|FAILED|PASSED|ERROR) *\]|skipped:|tests passed|tests failed' >> "$REPORT"
if grep -q 'skipped: no CUDA device' "$BUILD/cuda-tests.log"; then
    echo "NOTE: no usable CUDA device: the GPU tests skipped; nothing ran on a device" >> "$REPORT"
fi
if [ $rc -eq 0 ]; then
    echo "--- llmem bench device" >> "$REPORT"
    # shellcheck disable=SC2046
    timeout 300 "$BUILD/llmem" bench device $( [ "${QUICK:-0}" = 1 ] && echo --quick ) >> "$REPORT" 2>&1 ||
        echo "FAILED: llmem bench device (exit $?)" >> "$REPORT"
fi
echo "--- done in $(($(date +%s) - start)) s, tests exit status $rc" >> "$REPORT"
cat "$REPORT"
exit $rc
