#!/usr/bin/env bash
# One device call of the H200 runs (docs/GPU-RUNS.md). Usage, from the repo root on the device machine:
#     bash scripts/gpu_call.sh 1|2|3
# 1: park model part aa; per-op GEMV bandwidth; `onekernel bench` on Llama-3.2-1B and Llama-3.1-8B (random
#    weights, batch 1 and 8; every record also checks the mode's step against the PyTorch reference).
# 2 (at once after 1, the machine is still warm): join the default GGUF; real-model checks and profile
#    (gpu_suite.py real); `onekernel bench` and `--study` on it.
# 3: random-weight SmolLM2-135M profile, batch invariance, re-capture and every-mode smoke; per-op GEMV
#    bandwidth; `onekernel bench` Llama-3.2-1B (onekernel modes), `--study` Llama-3.2-1B batch 1,
#    `onekernel bench` Qwen3-8B batch 1.
# 4, then 5 at once: the cells run 3 did not reach (see benchmarks/README.md: "-" cells); 6 at once after 5:
#    the SmolLM2-135M study at batch 8. 7: the cells 4-6 left, compile caches warmed in parallel first.
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
3)  # what still needs the GPU after 1 and 2, by priority (no real weights needed)
    step 100 random $suite random
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/random.json"
    step 45 ops $suite ops
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/ops.json"
    step 100 bench-1b $bench --model llama-3.2-1b --random-weights --batch 1,8 \
        --modes torch+graph,eager,graph,pdl,megakernel
    step 160 study-1b $bench --model llama-3.2-1b --random-weights --study --batch 1
    step 110 bench-qwen3-8b $bench --model qwen3-8b --random-weights --batch 1 \
        --modes torch,torch+graph,eager,graph,pdl,megakernel,torch+compile
    ;;
4)  # what run 3 left unmeasured for the bench tables (issue 5), random weights; park model part aa for 5
    cp .model/smol.part-aa /tmp/model/
    step 120 bench-1b-b8 $bench --model llama-3.2-1b --random-weights --batch 8 \
        --modes torch+graph,megakernel,torch+compile
    step 200 bench-8b-b8 $bench --model llama-3.1-8b --random-weights --batch 8 \
        --modes torch+graph,pdl,megakernel
    step 230 bench-qwen3-8b-b8 $bench --model qwen3-8b --random-weights --batch 8 \
        --modes torch,torch+graph,eager,graph,pdl,megakernel,torch+compile
    ;;
5)  # at once after 4: the real model's missing batch-8 cells, the study's batch 8, Qwen3-8B torch+compile b1
    cat /tmp/model/smol.part-aa .model/smol.part-ab >"$GGUF" && log "model joined: $(stat -c %s "$GGUF") bytes"
    step 150 bench-135m-b8 $bench --model "$GGUF" --batch 8 \
        --modes torch+graph,torch+compile,eager,graph,pdl,megakernel
    step 150 study-1b-b8 $bench --model llama-3.2-1b --random-weights --study --batch 8
    step 150 bench-qwen3-8b-compile $bench --model qwen3-8b --random-weights --batch 1 --modes torch+graph,torch+compile
    ;;
6)  # at once after 5 (the joined GGUF is still in /tmp): the SmolLM2-135M study at batch 8, complete
    [ -f "$GGUF" ] || { log "no $GGUF: call 6 must follow 5 while the machine is warm"; exit 3; }
    step 220 study-135m-b8 $bench --model "$GGUF" --study --batch 8
    ;;
7)  # one call for the bench cells 4-6 could not finish: compiles, not steps, ate their time limits (at batch 8
    # an 8B-class GEMV kernel takes ~1 min to compile, a megakernel several). So first every compile runs at once,
    # in parallel processes of 2 steps each that fill the on-disk Triton and Inductor caches (6 processes hold
    # an 8B-class model: ~110 GB); then the timed runs, one at a time and with the machine otherwise idle.
    warm() { local name=$1; shift; timeout 280 python3 -m onekernel.cli bench --steps 2 --out /tmp/warm/$name "$@" \
             >"$W/warm-$name.log" 2>&1 & }
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    Q="--model qwen3-8b --random-weights"
    log "warm-up: 8 processes"
    warm q-eager $Q --batch 8 --modes eager
    warm q-pdl $Q --batch 8 --modes pdl
    warm q-mk $Q --batch 8 --modes megakernel
    warm q-tc8 $Q --batch 8 --modes torch+compile
    warm q-tc1 $Q --batch 1 --modes torch+compile
    warm 8b-mk $B8 --batch 8 --modes megakernel
    warm 1b-mk $B1 --batch 8 --modes megakernel
    warm 1b-tc $B1 --batch 8 --modes torch+compile
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 8 finished"
    run() { local lim=$1 name=$2; shift 2; mkdir -p "$W/$name"; step "$lim" "$name" $bench/"$name" "$@"; }
    run 130 bench-qwen3-8b-b8 $Q --batch 8 --modes torch,torch+graph,eager,graph,pdl,torch+compile,megakernel
    run 50 bench-1b-b8 $B1 --batch 8 --modes torch+graph,torch+compile,megakernel
    run 50 bench-8b-b8 $B8 --batch 8 --modes torch+graph,megakernel
    run 50 bench-qwen3-8b-compile $Q --batch 1 --modes torch+graph,torch+compile
    ;;
8)  # session 4 (issue 10): Llama-3.2-1B batch 1 before (.before = 0fa025f, carried) and after the architecture
    # change, same commands, same process layout; both compile caches warmed in parallel first, then timed one
    # process at a time, before/after/before/after. Then the random-weight GPU checks of the new tree.
    cp .model/smol.part-aa /tmp/model/
    B1="--model llama-3.2-1b --random-weights --batch 1 --modes torch+graph,eager,graph,pdl,megakernel"
    log "warm-up: before and after in parallel"
    (timeout 200 env PYTHONPATH=/tmp/site:$PWD/.before python3 -m onekernel.cli bench $B1 --steps 2 \
        --out /tmp/warm/before >"$W/warm-before.log" 2>&1) &
    (timeout 200 python3 -m onekernel.cli bench $B1 --steps 2 --out /tmp/warm/after >"$W/warm-after.log" 2>&1) &
    wait
    log "warm-up done"
    for i in 1 2; do
        mkdir -p "$W/before$i" "$W/after$i"
        lim=80; step $lim bench-before-$i env PYTHONPATH=/tmp/site:$PWD/.before ONEKERNEL_COMMIT=0fa025f \
            python3 -m onekernel.cli bench $B1 --out "$W/before$i"
        step $lim bench-after-$i python3 -m onekernel.cli bench $B1 --out "$W/after$i"
    done
    step 170 random $suite random
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/random.json"
    ;;
9)  # at once after 8: greedy tokens of the real model in every mode, before and after (checks: in parallel);
    # then the weight-streaming prototypes of issue 11 (timed, one at a time)
    cat /tmp/model/smol.part-aa .model/smol.part-ab >"$GGUF" && log "model joined: $(stat -c %s "$GGUF") bytes"
    (timeout 240 env PYTHONPATH=/tmp/site:$PWD/.before python3 scripts/greedy_tokens.py "$GGUF" "$W/tokens-before.json" \
        >"$W/tokens-before.log" 2>&1) &
    (timeout 240 python3 scripts/greedy_tokens.py "$GGUF" "$W/tokens-after.json" >"$W/tokens-after.log" 2>&1) &
    wait
    log "tokens: $(tail -n 5 "$W/tokens-after.log" | tr '\n' ' ')"
    python3 -c "import json,sys; a,b=(json.load(open(sys.argv[i])) for i in (1,2)); print('TOKENS equal before/after:', {f'{m}-{k}': a[m][k]==b[m][k] for m in a for k in ('b1','b3')})" \
        "$W/tokens-before.json" "$W/tokens-after.json" 2>&1 | tee -a "$OUT/log.txt"
    step 60 eager-host-before env PYTHONPATH=/tmp/site:$PWD/.before python3 scripts/eager_overhead.py
    step 60 eager-host-after python3 scripts/eager_overhead.py
    step 200 tl-stream python3 scripts/stream_proto/tl_stream.py --sweep --out "$W/tl_stream_sweep.json"
    for p in llama-1b llama-8b; do for v in deps nodeps; do
        step 60 "gluon-$p-$v" python3 scripts/stream_proto/gluon_stream.py --preset $p --variant $v --workers 132 \
            --out "$W/gluon_${p}_$v.json"
    done; done
    ;;
10) # session 4 (issue 11): the weight-streaming prototypes again (tl with the deferred-reduction layout; Gluon
    # with the Triton 3.6 loop-carry workaround and bounded waits), then the generation loop's overhead
    step 150 tl-stream python3 scripts/stream_proto/tl_stream.py --sweep --out "$W/tl_stream_sweep.json"
    step 60 gluon-1b-deps python3 scripts/stream_proto/gluon_stream.py --tiny-check --preset llama-1b --variant deps \
        --workers 132 --out "$W/gluon_llama-1b_deps.json"
    if grep -q "ms/step" "$W/gluon-1b-deps.log"; then
        step 60 gluon-1b-nodeps python3 scripts/stream_proto/gluon_stream.py --preset llama-1b --variant nodeps \
            --workers 132 --out "$W/gluon_llama-1b_nodeps.json"
        for v in deps nodeps; do
            step 60 "gluon-8b-$v" python3 scripts/stream_proto/gluon_stream.py --preset llama-8b --variant $v \
                --workers 132 --out "$W/gluon_llama-8b_$v.json"
        done
    fi
    step 150 generate-overhead python3 scripts/generate_overhead.py "$W/generate_overhead.json"
    ;;
11) # session 4, last commit: greedy tokens of random SmolLM2-135M weights in every mode, before (.before =
    # 0fa025f) and after (checks, in parallel); per-sequence sampling on the GPU; the Llama-1B batch-1 bench
    (timeout 240 env PYTHONPATH=/tmp/site:$PWD/.before python3 scripts/greedy_tokens.py smollm2-135m \
        "$W/tokens-before.json" >"$W/tokens-before.log" 2>&1) &
    (timeout 240 python3 scripts/greedy_tokens.py smollm2-135m "$W/tokens-after.json" >"$W/tokens-after.log" 2>&1) &
    (timeout 240 python3 scripts/sampling_check.py >"$W/sampling.log" 2>&1) &
    wait
    cat "$W/sampling.log" | tee -a "$OUT/log.txt"
    python3 -c "import json,sys; a,b=(json.load(open(sys.argv[i])) for i in (1,2)); print('TOKENS equal before/after:', {f'{m}-{k}': a[m][k]==b[m][k] for m in a for k in ('b1','b3')})" \
        "$W/tokens-before.json" "$W/tokens-after.json" 2>&1 | tee -a "$OUT/log.txt"
    mkdir -p "$W/bench"
    step 150 bench-1b $bench/bench --model llama-3.2-1b --random-weights --batch 1
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
esac
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >>"$OUT/log.txt" 2>&1
tar -czf "$OUT/results.tgz" -C "$W" . && log "packed $(ls "$W" | wc -l) files"
