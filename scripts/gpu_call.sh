#!/usr/bin/env bash
# One device call of the H200 runs (docs/GPU-RUNS.md). Usage, from the repo root on the device machine:
#     bash scripts/gpu_call.sh N   (N: one of the cases below)
# 1: park model part aa; per-op GEMV bandwidth; `onekernel bench` on Llama-3.2-1B and Llama-3.1-8B (random
#    weights, batch 1 and 8; every record also checks the mode's step against the PyTorch reference).
# 2 (at once after 1, the machine is still warm): join the default GGUF; real-model checks and profile
#    (gpu_suite.py real); `onekernel bench` and `--study` on it.
# 20 (kind nvidia-h200-x2): tensor parallel, TP=2 checks and `bench --tp 2` (issue 13).
# Calls 3-11 (sessions 2-5) are in docs/GPU-RUNS.md and in git history (`git show ab8f7cd:scripts/gpu_call.sh`).
# 21: the tensor-core GEMV path (issue 12 item 1): its GPU tests, invariance, per-op times, bench (carry .whl).
# Every step has its own time limit, so the call always ends with $OUT/results.tgz (all JSON, markdown,
# PNG and logs; the device tool returns at most 8 files) and $OUT/log.txt.
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ONEKERNEL_COMMIT=${ONEKERNEL_COMMIT:-}
W=$OUT/w
mkdir -p "$W" /tmp/model
GGUF=/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/log.txt"; }
step() {  # step SECONDS NAME COMMAND...
    local lim=$1 name=$2; shift 2
    log "start $name (limit ${lim}s)"
    timeout "$lim" "$@" >"$W/$name.log" 2>&1
    log "end $name: rc=$?"
    tail -n 25 "$W/$name.log"
}
bench="python3 -m onekernel.cli bench --out $W"    # word-split on purpose: `timeout` runs programs only
suite="env OUT=$W python3 scripts/gpu_suite.py"

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
case "$1" in
1)
    cp .model/smol.part-aa /tmp/model/
    step 75 ops $suite ops
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/ops.json"
    step 190 bench-1b $bench --model llama-3.2-1b --random-weights --batch 1,8
    step 300 bench-8b $bench --model llama-3.1-8b --random-weights --batch 1,8
    ;;
2)
    cat /tmp/model/smol.part-aa .model/smol.part-ab >"$GGUF" && log "model joined: $(stat -c %s "$GGUF") bytes"
    step 220 real $suite real "$GGUF"
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/real.json"
    step 120 bench-135m $bench --model "$GGUF" --batch 1,8
    step 230 study-135m $bench --model "$GGUF" --study --batch 1,8
    ;;
12) # issue 12 (compile time): cold and warm start of each case in fresh processes (empty, then warm Triton
    # cache; 3 cases at once, each process killed after 120 s): scripts/compile_times.py's default cases
    step 420 compile-times python3 scripts/compile_times.py --out "$W" --jobs 3 --timeout 120
    ;;
13) # issue 12 checks: bitwise batch invariance at B=2,8,16 in every Triton mode and both megakernel backends
    # (Llama-3.2-1B; Qwen3-0.6B for the q/k-norm path; in parallel), then the Llama-3.2-1B bench at 1, 8, 16
    (timeout 200 python3 scripts/invariance_check.py llama-3.2-1b --out "$W/inv-1b.json" >"$W/inv-1b.log" 2>&1) &
    (timeout 200 python3 scripts/invariance_check.py qwen3-0.6b --out "$W/inv-q.json" >"$W/inv-q.log" 2>&1) &
    wait
    cat "$W/inv-1b.log" "$W/inv-q.log" | grep -v Warning | tee -a "$OUT/log.txt"
    mkdir -p "$W/bench"
    step 200 bench-1b $bench/bench --model llama-3.2-1b --random-weights --batch 1,8,16 \
        --modes graph,pdl,megakernel,megakernel-triton
    ;;
14) # session 6, final commit (one call, ~9 min): the streaming megakernel's GPU test (Llama-1B); the bench
    # tables of Llama-3.2-1B (every mode) and Llama-3.1-8B (the compiled modes and torch+graph), batch 1, both
    # megakernel backends; the serving benchmark (issue 14: 1, 4, 16 clients), one process per mode so a mode
    # that runs out of time keeps the others' files
    step 50 stream-test env TRITON_INTERPRET=0 python3 -m pytest -q -x tests/test_stream_gpu.py -k llama \
        -p no:cacheprovider
    mkdir -p "$W/bench" "$W/serve"
    step 140 bench-1b $bench/bench --model llama-3.2-1b --random-weights --batch 1
    step 140 bench-8b $bench/bench --model llama-3.1-8b --random-weights --batch 1 \
        --modes torch+graph,graph,pdl,megakernel,megakernel-triton
    for m in megakernel graph pdl; do
        step 60 "serve-$m" python3 -m onekernel.bench.serve --model smollm2-135m --random-weights --modes "$m" \
            --out "$W/serve" --server-timeout 55
    done
    ;;
15) # session 6, after 14: the rows 14 lost to the JIT-hook TypeError (megakernel-triton on Llama-1B and 8B;
    # the served megakernel), then the streaming megakernel's GPU test
    mkdir -p "$W/bench" "$W/serve"
    step 45 bench-1b $bench/bench --model llama-3.2-1b --random-weights --batch 1 --modes megakernel-triton
    step 50 bench-8b $bench/bench --model llama-3.1-8b --random-weights --batch 1 --modes megakernel-triton
    step 55 serve-megakernel python3 -m onekernel.bench.serve --model smollm2-135m --random-weights \
        --modes megakernel --out "$W/serve" --server-timeout 50
    step 40 stream-test env TRITON_INTERPRET=0 python3 -m pytest -q -x tests/test_stream_gpu.py -k llama \
        -p no:cacheprovider
    ;;
16) # session 7, first call (HEAD): every compile cache warmed in parallel processes, with the GPU checks (streaming
    # megakernel test; bitwise batch invariance at B=2/8/16, every mode, Llama-1B and Qwen3-0.6B); then, one at a
    # time on the idle GPU, Llama-3.2-1B at batch 1,8,16 (every mode), Llama-3.1-8B at 1,8, the served megakernel
    warm() { local name=$1; shift; (timeout 180 python3 -m onekernel.cli bench --steps 2 --out /tmp/warm/$name "$@" \
             >"$W/warm-$name.log" 2>&1) & }
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    log "warm-up and checks: 9 processes"
    warm 1b-kern $B1 --batch 1,8,16 --modes eager,graph,pdl
    warm 1b-mk $B1 --batch 1,8,16 --modes megakernel
    warm 1b-mkt $B1 --batch 1,8,16 --modes megakernel-triton
    warm 1b-tc $B1 --batch 1,8,16 --modes torch+compile
    warm 8b-kern $B8 --batch 1,8 --modes graph,pdl,megakernel,megakernel-triton
    warm 8b-tc $B8 --batch 1,8 --modes torch+compile
    (timeout 180 python3 scripts/invariance_check.py llama-3.2-1b --out "$W/inv-1b.json" >"$W/inv-1b.log" 2>&1) &
    (timeout 180 python3 scripts/invariance_check.py qwen3-0.6b --out "$W/inv-q.json" >"$W/inv-q.log" 2>&1) &
    (timeout 180 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -p no:cacheprovider \
        >"$W/stream-test.log" 2>&1) &
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 6 finished"
    tail -n 4 "$W/stream-test.log" | tee -a "$OUT/log.txt"
    grep -h '"mode"' "$W"/inv-*.log | cut -c1-200 | tee -a "$OUT/log.txt"
    mkdir -p "$W/bench" "$W/serve"
    step 150 bench-1b $bench/bench $B1 --batch 1,8,16
    step 130 bench-8b $bench/bench $B8 --batch 1,8 --modes torch+graph,torch+compile,graph,pdl,megakernel,megakernel-triton
    step 55 serve-megakernel python3 -m onekernel.bench.serve --model smollm2-135m --random-weights \
        --modes megakernel --out "$W/serve" --server-timeout 50
    ;;
17|17a|17b) # session 7, final commit. On nvidia-h200-x2, one call: every compile cache warmed in parallel
    # processes over both GPUs, with the GPU checks; then Llama-3.2-1B on GPU 0 and Llama-3.1-8B on GPU 1 at the
    # same time (one process per GPU, 32 host cores), then the serving benchmark (GPU 0) and the per-op GEMV
    # times of both GEMV paths (GPU 1). On one H200, two calls back to back (the machine and its caches stay
    # warm between them): 17a = warm-up, checks and Llama-3.2-1B; 17b = Llama-3.1-8B, serving benchmark,
    # per-op GEMV times.
    G1=1; [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || G1=0
    part=${1#17}
    warm() { local gpu=$1 name=$2; shift 2; (timeout 200 env CUDA_VISIBLE_DEVICES=$gpu python3 -m onekernel.cli bench \
             --steps 2 --out /tmp/warm/$name "$@" >"$W/warm-$name.log" 2>&1) & }
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    M1="torch+graph,torch+compile,eager,graph,pdl,megakernel,megakernel-triton"
    M8="torch+graph,torch+compile,graph,pdl,megakernel,megakernel-triton"
    MMA="--gemv mma --batch 1,8,16 --modes graph,pdl,megakernel-triton"   # the tensor-core GEMV path
    mkdir -p "$W/bench" "$W/bench-mma" "$W/serve"
    if [ "$part" != b ]; then
        log "warm-up and checks (second GPU: $G1)"
        warm 0 1b-kern $B1 --batch 1,2,4,8,16 --modes eager,graph,pdl
        warm 0 1b-mk $B1 --batch 1,2,4,8,16 --modes megakernel
        warm 0 1b-mkt $B1 --batch 1,2,4,8,16 --modes megakernel-triton
        warm 0 1b-tc $B1 --batch 1,2,4,8,16 --modes torch+compile
        warm $G1 8b-kern $B8 --batch 1,2,4,8,16 --modes graph,pdl
        warm $G1 8b-mk $B8 --batch 1,2,4,8,16 --modes megakernel
        warm $G1 8b-mkt $B8 --batch 1,2,4,8,16 --modes megakernel-triton
        warm $G1 8b-tc $B8 --batch 1,2,4,8,16 --modes torch+compile
        warm 0 1b-mma $B1 $MMA
        warm $G1 8b-mma $B8 $MMA
        (timeout 200 env CUDA_VISIBLE_DEVICES=$G1 python3 -m onekernel.bench.serve --model smollm2-135m \
            --random-weights --modes megakernel,graph,pdl --out /tmp/warm/serve --server-timeout 190 \
            >"$W/warm-serve.log" 2>&1) &
        (timeout 200 env CUDA_VISIBLE_DEVICES=0 python3 scripts/invariance_check.py llama-3.2-1b \
            --out "$W/inv-1b.json" >"$W/inv-1b.log" 2>&1) &
        (timeout 200 env CUDA_VISIBLE_DEVICES=$G1 python3 scripts/invariance_check.py llama-3.2-1b --gemv mma \
            --modes eager,graph,pdl,megakernel/triton,megakernel/gluon --out "$W/inv-1b-mma.json" >"$W/inv-1b-mma.log" 2>&1) &
        (timeout 200 env CUDA_VISIBLE_DEVICES=$G1 python3 scripts/invariance_check.py qwen3-0.6b \
            --out "$W/inv-q.json" >"$W/inv-q.log" 2>&1) &
        (timeout 200 env CUDA_VISIBLE_DEVICES=$G1 TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py \
            tests/test_mma_gpu.py -p no:cacheprovider >"$W/stream-test.log" 2>&1) &
        wait
        log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 8 benches finished"
        tail -n 4 "$W/stream-test.log" | tee -a "$OUT/log.txt"
        grep -h '"mode"' "$W"/inv-*.log | cut -c1-200 | tee -a "$OUT/log.txt"
        (step 230 bench-1b env CUDA_VISIBLE_DEVICES=0 $bench/bench $B1 --batch 1,2,4,8,16 --modes $M1 &&
            step 80 bench-1b-mma env CUDA_VISIBLE_DEVICES=0 $bench/bench-mma $B1 $MMA) &
        [ "$part" = a ] || (step 230 bench-8b env CUDA_VISIBLE_DEVICES=1 $bench/bench $B8 --batch 1,2,4,8,16 \
            --modes $M8 --steps 100 && step 80 bench-8b-mma env CUDA_VISIBLE_DEVICES=1 $bench/bench-mma $B8 $MMA \
            --steps 100) &
        wait
    fi
    if [ "$part" = b ]; then
        step 230 bench-8b $bench/bench $B8 --batch 1,2,4,8,16 --modes $M8 --steps 100
        step 80 bench-8b-mma $bench/bench-mma $B8 $MMA --steps 100
    fi
    if [ "$part" != a ]; then
        (step 120 serve env CUDA_VISIBLE_DEVICES=0 python3 -m onekernel.bench.serve --model smollm2-135m \
            --random-weights --modes megakernel,graph,pdl --out "$W/serve" --server-timeout 100) &
        [ "$G1" = 1 ] || wait
        (step 100 mma-ops env CUDA_VISIBLE_DEVICES=$G1 python3 scripts/mma_ops.py --out "$W/mma-ops.json") &
        wait
    fi
    ;;
20) # session 7, issue 13's GPU part, kind nvidia-h200-x2 (~7.5 min): the TP=2 checks (scripts/tp_check.py: TP=2
    # logits and 32 greedy tokens against TP=1, every TP mode and all-reduce, batch 1 and 8) of Llama-3.2-1B and
    # Llama-3.1-8B in parallel (they also compile every TP=1 and TP=2 kernel the bench needs), then
    # `onekernel bench --tp 2` of each (torch, torch+graph, eager/graph/pdl x nccl/symm), one at a time
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    log "GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
    for m in llama-3.2-1b llama-3.1-8b; do
        (timeout 250 python3 scripts/tp_check.py --models $m --out "$W/tp-check-$m.json" \
            >"$W/tp-check-$m.log" 2>&1; echo "rc=$?" >>"$W/tp-check-$m.log") &
    done
    wait
    for m in llama-3.2-1b llama-3.1-8b; do
        log "tp_check $m: $(tail -n 1 "$W/tp-check-$m.log")"
        grep -h '^{' "$W/tp-check-$m.log" | cut -c1-260 | tee -a "$OUT/log.txt"
    done
    mkdir -p "$W/bench"
    step 90 bench-tp-1b $bench/bench --tp 2 --model llama-3.2-1b --random-weights --batch 1,8
    step 120 bench-tp-8b $bench/bench --tp 2 --model llama-3.1-8b --random-weights --batch 1,8
    ;;
esac
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >>"$OUT/log.txt" 2>&1
tar -czf "$OUT/results.tgz" -C "$W" . && log "packed $(ls "$W" | wc -l) files"
