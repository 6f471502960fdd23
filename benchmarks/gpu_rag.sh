#!/usr/bin/env bash
# Issue 24's RAG pipeline on one H200 (benchmarks/bench_rag_gpu.py), in one command of under 9 minutes, from the
# repository root. Two device calls, since .carry (58 MB) and the RAG artifacts do not fit into one 64 MiB copy:
#
#   here, once:     python -m benchmarks.pack_rag_gpu          # writes .carry-rag/ (~26 MiB, git-ignored)
#   call 1 (carry [".carry"]):      source .carry/on-device.sh   # makes /tmp/carry-venv, the bundled tritonserver
#   call 2 (carry [".carry-rag"]), on the same warm machine:
#                   RAGSTACK_COMMIT=<hash> bash benchmarks/gpu_rag.sh
#
# 1. the venv /tmp/carry-venv of call 1 on PATH (as on-device.sh sets it; missing: it stops at once), faiss
#    unpacked into it from .carry-rag/faiss-cpu.tar.xz unless it imports already;
# 2. the Llama-3-8B-shaped random checkpoint /tmp/l8b (make_random_model.py, ~30 s; kept if there);
# 3. bench_rag_gpu.py: the int8 ONNX models and the index unpacked into a repository beside the project's
#    configs, Triton started with --model-config-name=gpu (the llm's 8 instances), rag at concurrency 1, 16, 64
#    (32, 96, 192 queries, 128-token answers), each followed by the llm alone with the same prompts; the
#    per-step breakdown from the server's metrics; the target (rag TTFT p50 <= llm alone + 15 ms at c=1).
#    CONCURRENCY and REQUESTS (1,16,64 and 32,96,192) set the levels.
# Each step has its own time limit within the 500 s budget; a step that fails or times out is reported.
# $OUT (else /tmp/rag_gpu_out) gets: steps.log, rag_gpu.log (the bench's output and table), rag_gpu.jsonl (the
# record to append to benchmarks/results/), rag_gpu.json (every row with its step breakdown), tritonserver.log
# (its last 400 lines). The table and the steps are printed last.
#
# On the CPU, the same path with a tiny random llm of the same word-level tokenizer and small counts
# (CARRY_VENV: a venv with the bundled tritonserver, e.g. this checkout's .venv):
#   MODE=cpu CARRY_VENV=.venv bash benchmarks/gpu_rag.sh
set -u
cd "$(dirname "$0")/.."
MODE="${MODE:-gpu}"
OUT="${OUT:-/tmp/rag_gpu_out}"
BUDGET_S="${BUDGET_S:-500}"
CARRY_VENV="${CARRY_VENV:-/tmp/carry-venv}"
ART="${ARTIFACTS:-.carry-rag}"
LOGS=/tmp/rag_gpu_logs
WORK=/tmp/rag_gpu_work
START=$(date +%s)
mkdir -p "$OUT" "$LOGS"
rm -rf "$WORK"
IMAGE_PY=$(command -v python3)

fail() { echo "gpu_rag.sh: $*" | tee -a "$OUT/steps.log"; exit 2; }

[ -x "$CARRY_VENV/bin/python3" ] || fail "no venv at $CARRY_VENV: run \`source .carry/on-device.sh\` in an earlier call" \
    "on this machine (carry .carry), then this one (carry .carry-rag)"
CARRY_VENV=$(cd "$CARRY_VENV" && pwd)
sp=$(ls -d "$CARRY_VENV"/lib/python3*/site-packages 2>/dev/null | head -n 1)
export PATH="$CARRY_VENV/bin:$PATH"
export TRITONSERVER_DIR="${TRITONSERVER_DIR:-$sp/pytriton/tritonserver}"
export TRITONSERVER_LIBS="${TRITONSERVER_LIBS:-$sp/nvidia_pytriton.libs}"
[ -x "$TRITONSERVER_DIR/bin/tritonserver" ] || fail "no tritonserver at $TRITONSERVER_DIR (on-device.sh unpacks it)"
[ -f "$ART/rag-models.tar.xz" ] || fail "no $ART/rag-models.tar.xz: build it with \`python -m benchmarks.pack_rag_gpu\`" \
    "and carry $ART"
if ! python3 -c "import faiss" 2>/dev/null; then
    [ -f "$ART/faiss-cpu.tar.xz" ] || fail "faiss is not importable and $ART/faiss-cpu.tar.xz is missing"
    tar -xJf "$ART/faiss-cpu.tar.xz" -C "$sp" || fail "unpacking faiss into $sp failed"
fi
python3 -c "import sys, faiss, numpy, onnxruntime, tokenizers, tritonclient.grpc.aio as _; print(sys.executable, 'faiss',
faiss.__version__, 'numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__)" \
    >>"$OUT/steps.log" 2>&1 || { tail -n 5 "$OUT/steps.log"; fail "the venv cannot import faiss/numpy/onnxruntime/tokenizers/tritonclient"; }
export PYTHONPATH="$PWD:$PWD/clients${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The Python backend's stubs ignore PYTHONPATH (they see llm_engine only because the server runs in the
# repository root): the retriever and prompt_builder import ragstack, so the venv gets this checkout's
# clients/ for the run, through a .pth line removed at the end.
echo "$PWD/clients" >"$sp/ragstack-checkout.pth"
trap 'rm -f "$sp/ragstack-checkout.pth"' EXIT

STEP_KILL_AFTER=20  # the server and its engine process need longer to stop
source benchmarks/gpu_steps.sh  # step NAME LOG_DIR MAX_SECONDS command...

if [ "$MODE" = cpu ]; then
    MODEL="${MODEL:-/tmp/rag-tiny-llm}"
    step make_model "$LOGS" 60 python3 -m benchmarks.make_random_model --shape llama-tiny-test --out "$MODEL"
    BENCH=(--llm-config default --concurrency 1,4 --requests 4,8 --max-tokens 16 --warmup 4
           --engine '{"max_model_len": 2048}')
else
    MODEL="${MODEL:-/tmp/l8b}"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >>"$OUT/steps.log" 2>&1
    # the image's own python3, as the other GPU scripts make it (torch draws the weights on the GPU)
    step make_model "$LOGS" 90 "$IMAGE_PY" -m benchmarks.make_random_model --shape llama3-8b --out "$MODEL"
    [ -f "$MODEL/config.json" ] || step make_model_venv "$LOGS" 90 python3 -m benchmarks.make_random_model \
        --shape llama3-8b --out "$MODEL"
    BENCH=(--llm-config gpu --concurrency "${CONCURRENCY:-1,16,64}" --requests "${REQUESTS:-32,96,192}" --max-tokens 128
           --warmup 16)
fi
left=$((BUDGET_S - ($(date +%s) - START)))
step rag_gpu "$OUT" "$left" python3 -m benchmarks.bench_rag_gpu --model "$MODEL" --artifacts "$ART" "${BENCH[@]}" \
    --budget-s $((left - 40)) --work-dir "$WORK" --json "$OUT/rag_gpu.json" --record "$OUT/rag_gpu.jsonl"
tail -n 400 "$WORK/server/tritonserver.log" >"$OUT/tritonserver.log" 2>/dev/null

echo "===== rag_gpu"
grep -E "^\||^Target|server ready|warm-up|skipped|timed out|Traceback|Error" "$OUT/rag_gpu.log" | cut -c1-250
echo "===== steps"; cat "$OUT/steps.log"
echo "total $(($(date +%s) - START)) s"
