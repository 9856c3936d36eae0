#!/bin/sh
# sim_vs_engine.sh - the simulated engine against the real one on the same
# workload (docs/BENCHMARKS.md, "The simulation against the real engine").
# Run from the build folder: flock /work/bench.lock ../bench/sim_vs_engine.sh
set -e
M=${MODEL:-../../shared/models/stories260K.bin}
T=${TRACE:-../../shared/traces/AzureLLMInferenceTrace_code.csv}
W="--trace $T --requests 300 --speedup ${SPEED:-8} --prompt-scale 0.06 --kv-budget ${BUDGET:-8MiB} --max-batch 16 --max-prefill 512 --max-seq-len 512 --json"
E1=$(./llmem replay --engine $M --threads 1 $W 2>/tmp/fit1.txt)
F=$(sed -n 's/.*--step-model //p' /tmp/fit1.txt)
echo "fit on requests 0-299: $F"; head -1 /tmp/fit1.txt
echo "E1 $E1"
echo "S1 $(./llmem replay --model-shape stories260k --kv-dtype f32 --step-model $F $W)"
echo "E2 $(./llmem replay --engine $M --threads 1 $W --first-request 300 2>/tmp/fit2.txt)"
head -1 /tmp/fit2.txt
echo "S2 $(./llmem replay --model-shape stories260k --kv-dtype f32 --step-model $F $W --first-request 300)"
C=$(./llmem replay --calibrate $M --threads 1 | sed -n 's/.*--step-model //p')
echo "grid calibration: $C"
echo "C2 $(./llmem replay --model-shape stories260k --kv-dtype f32 --step-model $C $W --first-request 300)"
