#!/usr/bin/env bash
# Issue 25 (FP8 weights) on one H200, in one command of under 8 minutes, from the repository root:
#
#     RAGSTACK_COMMIT=<hash> bash benchmarks/gpu_fp8.sh
#
# 1. the Llama-3.1-8B-shaped random bf16 checkpoint (make_random_model.py, ~30 s);
# 2. the FP8 tests on the GPU (kernels against their references, the FP8 model's W8A8 function with
#    CUDA graphs; at most 90 s);
# 3. the engine, in one run: (a) and (b) with bf16 weights, FP8 weights, FP8 weights + FP8 KV
#    (bench_engine.py: issue 25's targets in its notes);
# 4. the kernels: the FP8 GEMM (Triton and torch._scaled_mm) against bf16 matmul at M = 1..8192, FP8
#    skinny_linear against bf16 at M = 1..16, workload (c)'s prefill chunk with bf16 and FP8 KV
#    (bench_kernels.py: TB/s, TFLOP/s, the floor; the fp8_gemm row buckets to write into h200.json);
# 5. FP8 against bf16 on the 8B shape: logits' relative error, teacher-forced and greedy agreement.
# `bash benchmarks/gpu_fp8.sh kv` runs instead the FP8 KV study of workload (c) (8 x 16k prompts, where FP8 KV
# ran slower than bf16 KV): the engine on (c) with bf16 KV, FP8 KV read as e4m3 tiles, and FP8 KV as configured
# (h200.json: prefill chunks of at least 1024 tokens dequantized to a bf16 scratch cache first, launch config
# dequantize_min_tokens), and the prefill kernels alone (8k, 8k FP8, the 8k-of-16k chunk three ways), also
# within 8 minutes.
# `bash benchmarks/gpu_fp8.sh step` runs instead (b)'s step study: the quantizers' GPU tests (bytes as the
# unfused kernels give them); the norm's fused per-token quantizer against the two kernels it replaces, tiles
# swept; (a) and (b) with bf16 and FP8 weights + FP8 KV, then (b) both ways at 512 sequences a step; then
# where a (b) step's time goes with FP8 (profile_engine, steps 300-340).
# `bash benchmarks/gpu_fp8.sh sweep` runs instead (a)'s single-row study: the FP8 single-row chain's tiles swept
# and each projection alone at one row, bf16 and FP8 (sweep.json); (a) with bf16, FP8 as configured and FP8
# with the sweep's best tile; then the kernel targets (FP8 GEMM, prefill 8k, FP8 KV decode at 32k, the
# 16k chunk) into kernels2.jsonl.
# Each step has its own time limit within the 470 s budget; a step that fails or times out is
# reported and the next runs. $OUT (the device tool's folder, which returns at most 8 files; else
# /tmp/fp8_out) gets seven: steps.log (the GPU, each step's exit and time, the end of a failed step's
# log), engine.log + engine.jsonl and kernels.log + kernels.jsonl (the records to append to
# benchmarks/results/), accuracy.json, tests.log. The end of each is printed last.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/clients${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/fp8_out}"
MODEL="${MODEL:-/tmp/l8b}"
BUDGET_S="${BUDGET_S:-470}"
PY="${PYTHON:-python3}"
LOGS=/tmp/fp8_logs
mkdir -p "$OUT" "$LOGS"
START=$(date +%s)

source benchmarks/gpu_steps.sh  # step NAME LOG_DIR MAX_SECONDS command...

nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv >>"$OUT/steps.log" 2>&1
step make_model "$LOGS" 60 "$PY" -m benchmarks.make_random_model --shape llama3-8b --out "$MODEL"
if [ "${1:-fp8}" = kv ]; then
    step kernels "$OUT" 120 "$PY" -m benchmarks.bench_kernels --cases prefill_8k,prefill_8k_fp8,prefill_16k_chunk \
        --record "$OUT/kernels.jsonl"
    step engine "$OUT" 260 "$PY" -m benchmarks.bench_engine --model "$MODEL" --workloads c --no-hf \
        --engine '{}' \
        --engine '{"kv_cache_dtype": "fp8_e4m3", "launch_params": {"paged_prefill_attention": {"dequantize_min_tokens": null}}}' \
        --engine '{"kv_cache_dtype": "fp8_e4m3"}' \
        --record "$OUT/engine.jsonl"
    echo "===== kernels"; grep -E "^\| prefill|^limits" "$OUT/kernels.log" | cut -c1-190
    echo "===== engine"; grep -E "^\|" "$OUT/engine.log" | cut -c1-300
    echo "===== steps"; cat "$OUT/steps.log"
    echo "total $(($(date +%s) - START)) s"
    exit 0
fi
if [ "${1:-fp8}" = step ]; then
    step tests "$OUT" 90 "$PY" -m pytest -q -p no:cacheprovider --confcutdir=tests/engine \
        tests/engine/test_kernels_fp8.py -k 'quantiz and not cpu'
    step kernels "$OUT" 90 "$PY" -m benchmarks.bench_kernels --cases rms_norm_fp8 --sweep \
        --json "$OUT/sweep.json" --record "$OUT/kernels.jsonl"
    step engine "$OUT" 160 "$PY" -m benchmarks.bench_engine --model "$MODEL" --workloads a,b --no-hf \
        --engine '{}' --engine '{"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}' --record "$OUT/engine.jsonl"
    # The engines above at the default of 1024 sequences a step on this GPU, then at 512, as before.
    step engine_512 "$LOGS" 130 "$PY" -m benchmarks.bench_engine --model "$MODEL" --workloads b --no-hf \
        --engine '{"max_num_seqs": 512}' \
        --engine '{"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3", "max_num_seqs": 512}' \
        --record "$OUT/engine.jsonl"
    step profile "$LOGS" 90 "$PY" -m benchmarks.profile_engine --model "$MODEL" --workload b --steps 300:340 \
        --final-only --engine '{"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}' --top 14
    echo "===== tests"; tail -n 5 "$OUT/tests.log"
    echo "===== kernels"; grep -hE "^\| |sweep:|^Best|^limits|differ" "$OUT/kernels.log" | cut -c1-200
    echo "===== engine"; grep -hE "^\|" "$OUT/engine.log" "$LOGS/engine_512.log" | cut -c1-250
    echo "===== profile"; tail -n 22 "$LOGS/profile.log" | cut -c1-200
    echo "===== steps"; cat "$OUT/steps.log"
    echo "total $(($(date +%s) - START)) s"
    exit 0
fi
if [ "${1:-fp8}" = sweep ]; then
    # each of the 27 tiles compiles for several seconds: an H100 had compiled fewer than 27 in 170 s
    step sweep "$OUT" 280 "$PY" -m benchmarks.bench_kernels --cases projections_single_row,layer_single_row_fp8 \
        --sweep --json "$OUT/sweep.json" --record "$OUT/kernels.jsonl"
    # The sweep's fastest single-row FP8 tile, tried in the engine beside the configured one (as an override of
    # every skinny_linear launch: in (a) with FP8 weights those are the single-row FP8 projections).
    best=$("$PY" -c "import json, sys
s = [s for s in json.load(open(sys.argv[1]))['sweeps'] if s['case'] == 'layer projections b=1 fused fp8' and 'best' in s]
print(json.dumps({'quantization': 'fp8', 'launch_params': {'skinny_linear': s[0]['best']['params']}}) if s else '')
" "$OUT/sweep.json" 2>>"$OUT/steps.log")
    step engine "$OUT" 100 "$PY" -m benchmarks.bench_engine --model "$MODEL" --workloads a --no-hf \
        --engine '{}' --engine '{"quantization": "fp8"}' ${best:+--engine "$best"} --record "$OUT/engine.jsonl"
    step kernels "$OUT" 90 "$PY" -m benchmarks.bench_kernels \
        --cases fp8_gemm,prefill_8k,prefill_8k_fp8,decode_32k,prefill_16k_chunk --record "$OUT/kernels2.jsonl"
    echo "===== sweep"; grep -E "^\| (layer|projection)|sweep:|^Best|^ *layer" "$OUT/sweep.log" | cut -c1-230
    echo "===== engine"; grep -E "^\||roofline" "$OUT/engine.log" | cut -c1-250
    echo "===== kernels"; grep -E "^\| |^limits" "$OUT/kernels.log" | cut -c1-200
    echo "===== steps"; cat "$OUT/steps.log"
    echo "total $(($(date +%s) - START)) s"
    exit 0
fi
step tests "$OUT" 90 "$PY" -m pytest -q -p no:cacheprovider --confcutdir=tests/engine -m 'not slow' --durations=5 \
    tests/engine/test_kernels_fp8.py tests/engine/test_fp8_model.py -k 'not cpu'
step engine "$OUT" 240 "$PY" -m benchmarks.bench_engine --model "$MODEL" --workloads a,b --no-hf \
    --engine '{}' --engine '{"quantization": "fp8"}' \
    --engine '{"quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}' \
    --record "$OUT/engine.jsonl"
step kernels "$OUT" 110 "$PY" -m benchmarks.bench_kernels --cases fp8_gemm,layer_small_batch_fp8,prefill_16k_chunk \
    --reps 20 --record "$OUT/kernels.jsonl"
step accuracy "$LOGS" 60 "$PY" -m benchmarks.fp8_accuracy --model "$MODEL" --prompts 4 --prompt-len 128 --gen 64 \
    --json "$OUT/accuracy.json"

echo "===== tests"; tail -n 12 "$OUT/tests.log" 2>/dev/null
echo "===== accuracy"; cat "$OUT/accuracy.json" 2>/dev/null | tr -d '\n' | cut -c1-900; echo
echo "===== kernels"; grep -E "^\| (layer|prefill chunk)|^limits|^fp8_gemm row buckets" "$OUT/kernels.log" 2>/dev/null \
    | cut -c1-230
echo "===== engine"; grep -E "^\|" "$OUT/engine.log" 2>/dev/null | cut -c1-250
grep -E "roofline" "$OUT/engine.log" 2>/dev/null | tr ';' '\n'
echo "===== steps"; cat "$OUT/steps.log"
echo "total $(($(date +%s) - START)) s"
