#!/usr/bin/env bash
# The GPU figures of issue 18 (item 5) in one short run, for a lent GPU machine:
#
#     bash benchmarks/gpu.sh [SECONDS]     # default 480: every part shares one deadline
#
# (The first run, 2026-11-26 on an H200, took 362 s for the parts then; the Tree-LSTM
# needed 155 s for 4 cells; the third, 2026-11-27 on an H100, 368 s, and the NUTS parts
# ran out of time before their last targets. Drop parts rather than raise the budget
# past the lease: a session has 15 minutes of device time, starts included.)
#
#     PARTS="smoke pool_masked treelstm" bash benchmarks/gpu.sh 300   # only these parts
#
# Each part writes $OUT/NAME.log (or /tmp/pcbatch-gpu/NAME.log) and prints its tail;
# a part that fails or runs out of time does not stop the next. BlackJAX is used if
# importable (carry its wheel: benchmarks/README.md, "On a GPU").
#
# f32 matrix products run at full precision (JAX_DEFAULT_MATMUL_PRECISION=highest):
# the benchmarks check pcbatch against the peers at rtol 1e-5, which TF32 misses.
# Both sides run at the same precision, so the ratios stay fair.
set -u
budget=${1:-480}
start=$(date +%s)
out=${OUT:-/tmp/pcbatch-gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest
py=${PYTHON:-python3}

part() {   # part NAME MAX_SECONDS COMMAND...: run with the smaller of its limit and the time left
    local name=$1 limit=$2; shift 2
    [[ -z "${PARTS:-}" || $name == smoke || " $PARTS " == *" $name "* ]] || return 0   # the smoke check always runs
    local left=$(( budget - ($(date +%s) - start) ))
    (( left < limit )) && limit=$left
    if (( limit < 15 )); then echo "== $name: skipped (no time left)"; return; fi
    echo "== $name (limit ${limit}s): $*"
    local t0=$(date +%s)
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "-- $name: rc=$? in $(( $(date +%s) - t0 ))s"
    tail -n "${TAIL:-30}" "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
part smoke 120 "$py" -m benchmarks.gpu_smoke
[ -s "$out/smoke.log" ] && grep -q "smoke ok" "$out/smoke.log" || { echo "smoke failed: stopping"; exit 1; }

# the fork-join pool's updates under conditionals (the CPU's way) against masked (the GPU's default)
part pool_masked 60 "$py" -m benchmarks.pool_masked --repeats 5
part treelstm 50 "$py" -m benchmarks.treelstm --batches 64 --hiddens 64 --repeats 3
# the natural loop-recursive Child-Sum Tree-LSTM on stdlib ASTs (issue 19) against the depth-batched peer
part treelstm_ast 90 "$py" -m benchmarks.treelstm_ast --batches 64,256 --hiddens 64 --max-nodes 64 --repeats 3
# generated against hand-written machines at batch 1024 (issue 17.4)
part vm_overhead 60 "$py" -m benchmarks.vm_overhead --quick --skip-compile --skip-hlo
part step_hlo 50 "$py" -m benchmarks.step_hlo
# the default (on a GPU: every block masked where gradients are cheap) against GradientLast with
# masked follow blocks (`last`) and with each follow block under a lax.cond (`conds`, the CPU's way)
part nuts_gaussian 150 "$py" -m benchmarks.nuts --targets gaussian,logistic --chains 1,16,128 --peers blackjax --variants last,conds --repeats 3 --figure ''
part nuts_cheap 150 "$py" -m benchmarks.nuts --targets student_t,eight_schools,funnel,funnel_centered --chains 16,128 --peers blackjax --repeats 3 --figure ''
# XLA's command buffers for loops and conditionals (CUDA graphs)
part nuts_cmdbuf 60 env XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL "$py" -m benchmarks.nuts --targets gaussian --chains 128 --peers blackjax --repeats 3 --figure ''
# the targets the third run's deadline cut (the centered funnel has not run on a GPU yet)
part nuts_cut 90 "$py" -m benchmarks.nuts --targets student_t,funnel_centered --chains 16,128 --peers blackjax --repeats 3 --figure ''
# training: the gradient pass's block under one switch (the GPU's default) against a cond per block
part train 120 "$py" -m benchmarks.treelstm_train --batches 32 --variants gradconds,gradswitch --repeats 3 --min-time 0.3
# what time is left: is pcbatch right on the GPU too? (-n 0: xdist workers crashed on the GPU)
part tests 90 env JAX_PLATFORMS=cuda XLA_FLAGS= "$py" -m pytest -q -x -p no:cacheprovider -n 0 tests/fuzz/test_fuzz_follow.py tests/fuzz/test_fuzz_forked.py tests/core/test_api.py tests/grad/test_grad_models.py
echo "== done in $(( $(date +%s) - start ))s"
