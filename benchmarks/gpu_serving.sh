#!/usr/bin/env bash
# Issues 24 and 22 on one H200, in one command of under 9 minutes, from the repository root, with .carry
# carried (`bash ../shared/device/pack.sh` plus the wheels of the OpenAI frontend and of py-spy; the benchmark
# reads the frontend without the openai SDK; benchmarks/__init__.py):
#
#     source .carry/on-device.sh; RAGSTACK_COMMIT=<hash> bash benchmarks/gpu_serving.sh
#
# 1. the Llama-3-8B-shaped random checkpoint /tmp/l8b (make_random_model.py, ~30 s; kept if there);
# 2. bench_serving: the llm with 8 instances through Triton against the same requests in-process, at
#    concurrency 1, 16, 64, 256 (issue 24's targets, checked in its notes);
# 3. bench_serving --api openai --openai-workers 4 (OPENAI_WORKERS): the OpenAI frontend against Triton's gRPC on one server,
#    taking turns in rounds (issue 22's targets; OPENAI_REQUESTS 32,96,192,384 and ROUNDS 8,2,1,1 per level:
#    at one stream, 4 requests of each system per round). SERVING_ONLY=1 leaves it out, OPENAI_ONLY=1 step 2.
# CONCURRENCY and NUM_REQUESTS (1,16,64,256 and 4,96,192,384) set the levels, ENGINE (JSON) the engine,
# INSTANCES (8) the llm's instances.
# PROFILE=1: during step 2's last level, py-spy records 8 s of the engine process behind Triton, then 8 s of
# the in-process benchmark (every thread, idle included, as collapsed stacks: `benchmarks.pyspy_summary` reads
# them), with `top` over the same seconds (every process, then the profiled process's threads). PYSPY names
# the binary, else the venv's or PATH's (py-spy's wheel in .carry puts it there).
# Each step has its own time limit (the openai step's: OPENAI_STEP_S, 330) within the BUDGET_S (480) budget; a
# step that fails or times out is reported. $OUT (else /tmp/serving_out) gets steps.log, serving.log +
# serving.jsonl, openai.log + openai.jsonl (the records to append to benchmarks/results/serving.jsonl) and, with
# PROFILE=1, engine_triton.txt, engine_in_process.txt and their top_*.txt. The tables and the steps are printed last.
# /tmp/carry-venv stays for gpu_rag.sh's call on the same warm machine.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/clients${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/serving_out}"
MODEL="${MODEL:-/tmp/l8b}"
BUDGET_S="${BUDGET_S:-480}"
LOGS=/tmp/serving_logs
mkdir -p "$OUT" "$LOGS"
START=$(date +%s)
STEP_KILL_AFTER=20  # the server and its engine process need longer to stop
source benchmarks/gpu_steps.sh  # step NAME LOG_DIR MAX_SECONDS command...

nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv >>"$OUT/steps.log" 2>&1
[ -f "$MODEL/config.json" ] || step make_model "$LOGS" 90 python3 -m benchmarks.make_random_model \
    --shape llama3-8b --out "$MODEL"

REQUEST_SHAPE=(--prompt-len 128,1024 --output-len 128,512 --engine "${ENGINE:-{\}}")
LEVELS=(--concurrency "${CONCURRENCY:-1,16,64,256}" --num-requests "${NUM_REQUESTS:-4,96,192,384}"
        "${REQUEST_SHAPE[@]}")

# profile_after PATTERN PGREP_REGEX NAME: once serving.log has a line matching PATTERN (the row of the level
# before the last), waits 3 s for the last level's streams to fill and records 8 s of the process pgrep finds.
profile_after() {
    local pattern=$1 regex=$2 name=$3 pid
    for _ in $(seq 900); do
        grep -q "$pattern" "$OUT/serving.log" 2>/dev/null && break
        sleep 0.5
    done
    sleep 3
    pid=$(pgrep -nf "$regex") || { echo "[profile $name] no process matches $regex" >>"$OUT/steps.log"; return; }
    # what every process takes of the cores meanwhile (the host's 16 cores serve the engine, Triton, the stubs
    # and the benchmark's client processes)
    top -b -n 2 -d 7 -w 250 -c >"$OUT/top_$name.txt" 2>&1 &
    local top_all=$!
    # and the profiled process's threads, native ones included (py-spy sees only Python's)
    top -H -b -n 2 -d 7 -w 250 -p "$pid" >"$LOGS/threads_$name.txt" 2>&1 &
    local top_threads=$!
    "$PYSPY" record --duration 8 --rate 200 --idle --threads --nonblocking --format raw \
        --output "$OUT/$name.txt" --pid "$pid" >"$LOGS/profile_$name.log" 2>&1
    echo "[profile $name] py-spy exit $? (pid $pid)" >>"$OUT/steps.log"
    wait "$top_all" "$top_threads"
    cat "$LOGS/threads_$name.txt" >>"$OUT/top_$name.txt"
    tail -n 3 "$LOGS/profile_$name.log" | sed "s/^/[profile $name] /" >>"$OUT/steps.log"
}
if [ "${PROFILE:-0}" = 1 ]; then
    sp=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    PYSPY=${PYSPY:-$(ls "$sp/bin/py-spy" 2>/dev/null || command -v py-spy)}
    IFS=, read -ra levels <<<"${CONCURRENCY:-1,16,64,256}"; before=${levels[-2]:-none}
    if [ -x "$PYSPY" ]; then
        ( profile_after "'system': 'triton x${INSTANCES:-8}', 'concurrency': $before" \
              "llm_engine.engine.engine_process" engine_triton
          profile_after "'system': 'in-process', 'concurrency': $before" "^python3 -m benchmarks.bench_serving" \
              engine_in_process ) &
        PROFILER=$!
    else
        echo "PROFILE=1: no py-spy in $sp/bin or on PATH" | tee -a "$OUT/steps.log"
    fi
fi
[ "${OPENAI_ONLY:-0}" = 1 ] || step serving "$OUT" 330 python3 -m benchmarks.bench_serving --model "$MODEL" "${LEVELS[@]}" \
    --instances "${INSTANCES:-8}" --record "$OUT/serving.jsonl"
[ -z "${PROFILER:-}" ] || { kill "$PROFILER" 2>/dev/null; wait "$PROFILER" 2>/dev/null; }
OPENAI_LEVELS=(--concurrency "${CONCURRENCY:-1,16,64,256}" --num-requests "${OPENAI_REQUESTS:-32,96,192,384}"
               --rounds "${ROUNDS:-8,2,1,1}" "${REQUEST_SHAPE[@]}")
[ "${SERVING_ONLY:-0}" = 1 ] || step openai "$OUT" "${OPENAI_STEP_S:-330}" python3 -m benchmarks.bench_serving --model "$MODEL" \
    "${OPENAI_LEVELS[@]}" --instances "${INSTANCES:-8}" --api openai --openai-workers "${OPENAI_WORKERS:-4}" \
    --record "$OUT/openai.jsonl"

for name in serving openai; do
    echo "===== $name"; grep -E "^\||target|within|ratio" "$OUT/$name.log" 2>/dev/null | cut -c1-260
done
echo "===== steps"; cat "$OUT/steps.log"
echo "total $(($(date +%s) - START)) s"
