# Sourced by the one-command GPU scripts (gpu_fp8.sh, gpu_rag.sh): `step` runs one step of a script's
# time budget. The script sets BUDGET_S, START (its start, `date +%s`) and OUT; STEP_KILL_AFTER (10 s) is how
# long a step that ignores the SIGINT of its limit gets before SIGKILL.

step() {  # step NAME LOG_DIR MAX_SECONDS command...: within MAX_SECONDS and what is left of the budget
    local name=$1 dir=$2 max=$3
    shift 3
    local left=$((BUDGET_S - ($(date +%s) - START)))
    local limit=$((max < left ? max : left))
    if [ "$limit" -le 10 ]; then
        echo "[$name] skipped: the budget is spent" | tee -a "$OUT/steps.log"
        return
    fi
    local t0=$(date +%s)
    timeout --signal=INT --kill-after="${STEP_KILL_AFTER:-10}" "$limit" "$@" >"$dir/$name.log" 2>&1
    local rc=$?
    echo "[$name] exit $rc after $(($(date +%s) - t0)) s (limit $limit s)" | tee -a "$OUT/steps.log"
    if [ "$rc" -ne 0 ]; then
        tail -n 15 "$dir/$name.log" | sed "s/^/[$name] /" >>"$OUT/steps.log"
    fi
}
