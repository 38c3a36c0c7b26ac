#!/usr/bin/env bash
# One device call of the H200 runs (docs/GPU-RUNS.md). Usage, from the repo root on the device machine:
#     bash scripts/gpu_call.sh N   (N: one of the cases below)
# 1: park model part aa; per-op GEMV bandwidth; `onekernel bench` on Llama-3.2-1B and Llama-3.1-8B (random
#    weights, batch 1 and 8; every record also checks the mode's step against the PyTorch reference).
# 2 (at once after 1, the machine is still warm): join the default GGUF; real-model checks and profile
#    (gpu_suite.py real); `onekernel bench` and `--study` on it.
# Calls 3-11 (sessions 2-5), 14-17 (sessions 6-7), 20 (session 7), 30, 31, 40, 41 (session 8) and 50, 51 (session 9)
# are in docs/GPU-RUNS.md and in git history (`git show ab8f7cd:scripts/gpu_call.sh`, `git show 51e26d6:...`,
# `git show bcdbdca:scripts/gpu_call.sh`).
# 70 + 71 + 72 (session 9's final commit), 80, 81 (session 10's measurements of the attention loop and the cp.async
# prefetch): in git history (`git show b551550:scripts/gpu_call.sh`).
# 90 + 91 (kind nvidia-h200-x2, back to back): session 10's final commit.
# 390 + 391 + 392 (kind nvidia-h200-x2, back to back): issue 13's whole two-GPU run (session 39, not yet run);
# 385: the one-shot all-reduce kernels on one H200, each run alone (written in session 39, run in session 40).
# 395: one TP rank's step without its all-reduces on one H200 (session 40); 396: its profile; 398: session 41's final
# table (395's, at one commit); 400: SPLIT 64 against 128 at 4096 (written in session 41; not run yet). 401
# (session 42: stream-K GEMV tasks against STREAM_SPLIT_K=0; slower, not kept) is in git history (`git show
# c32889b:scripts/gpu_call.sh`, the code there). 397 (the split-KV size of the
# few-KV-head shards, ONEKERNEL_ATTN_SPLIT) and 399 (SPLIT 32 at 4096, the 70B dead-splits test), session 41: in git
# history (`git show 32fad19:scripts/gpu_call.sh`).
# 120 (the loader's L2 prefetch and attention's dead-block skip: both slower; branch s12-measure), 121 (attention with
# the warps splitting each split's positions: kept) and 122 (its K/V two blocks ahead, the merge's one-round-trip rows:
# no gain): session 12's measurements, in git history (`git show 269d585:scripts/gpu_call.sh`, `git show 4eabe69:...`).
# 123 (branch s12-keep-a: slower), 124 (graph and pdl on the Gluon bodies: kept as modes graph-gluon / pdl-gluon) and
# 130 (the code-size probe: no effect): session 13's measurements, in git history (`git show a697e78:scripts/gpu_call.sh`,
# `git show 3568dd7:...`).
# 133 (attention on the tensor cores: slower; branch s13-attn-mma), 132 (segment kernels without the end wait: not
# kept; s13-endwait), 140 + 141 (the merge folded into attention: kept) and 142 (run 14's batch-16 megakernel rows):
# session 14.
# 150 (attention's K/V ring, dead-tile skipping, GB 16 blocks: none kept) and 151 (unrolled epilogues: slower), then
# 160 + 161 + 162 (its final commit): session 16.
# 170 (profiles with the attention sub-stamps, the 8B warm start), 171 (deferred chain sums, the loader's L2 prefetch
# on a full ring: both slower), 172 (pdl-gluon beside pdl), 173 and 174 (attention on the tensor cores, branches
# s17-attn-mma and s17-attn-ring: slower): session 17; nothing merged, so no final-table call.
# 180 + 181 (the tensor-core attention against the CUDA-core one; 181 with an L2 prefetch, removed), 182 (the final
# tables at a88ee12), 183 (the 8B batch-8 A/B, the per-op table, the 1B profile), 184 (branch s18-attn-rbuf, slower; in
# git history, `git show 936499e:scripts/gpu_call.sh`), 185 (stamps inside the attention's block loop): session 18.
# 182 (session 18's final tables) and 191 + 192 (session 19's; the GGUF in two halves, which no longer fit a call): in
# git history (`git show 92b6352:scripts/gpu_call.sh`).
# 200-209 (session 20: branch A/Bs, the final tables 201 + 202, the GGUF in three parts 204-206): in git history
# (`git show 176829c:scripts/gpu_call.sh`); 211 + 212 + 213 replace them.
# 220 + 221 (session 22: the weight stream's L2 evict_first copies, kept; the LM head's per-lane argmax, the L2 prefetch on
# a full ring and the RoPE table, dropped): in git history (`git show e95c4a7:scripts/gpu_call.sh`, the switches there).
# 230 + 231 (session 23: NCCL's LL protocol for the gate_up -> down hand-over, STREAM_LL=1; slower, dropped): in git
# history (`git show f4c7ef2:scripts/gpu_call.sh`, the code there). 232 + 233 (session 23: every streaming GPU test with the
# new rewind test, a correctness sweep of SmolLM2-360M / 1.7B, Llama-3.2-3B, Qwen3-0.6B) and 234 (Qwen3 on the streaming
# megakernel: its GPU tests and first table; 235 below repeats it with baselines): `git show 4cf36b2:scripts/gpu_call.sh`.
# 240 + 241 (session 24: the activation prefetch switches STREAM_ASYNC_A / STREAM_DIRECT_A, kept as the batch rule of
# stream_base.mma_async_a / mma_direct_a): in git history (`git show 5a05132:scripts/gpu_call.sh`, the switches there).
# 250 (session 25: attention's one-block tiles two at a time in every warp, STREAM_ATTN_PAIR=1; bitwise the same, slower,
# dropped): in git history (`git show 50a06b7:scripts/gpu_call.sh`, the code there).
# 251 + 252 + 253 (session 25's final tables: 211 with an A/B of the switches STREAM_STACK_ACC / STREAM_ONE_STAGE, then
# 212 and the Qwen3 tables, then the SmolLM2 table again because 252 started cold): in git history (`git show
# 6752d5e:scripts/gpu_call.sh`); 211 + 212 (run at once, without giving the machine back between) + 243 + 244 replace them.
# 260 (session 26: scripts/gemv_sweep.py over the separate kernels' GEMV tiles, kept as their defaults; pdl on the
# streaming bodies beside pdl, kept as its default for tensor-core steps; co-resident segment kernels, STREAM_SEG_CORESIDENT=1,
# dropped): in git history (`git show 7aaa114:scripts/gpu_call.sh`, the code there).
# 261 + 262 (session 26's final tables) and 270 (session 27: qkv_rope's units per tile, ops.qkv.qkv_tiles, swept and
# A/B'd against U = 1 with the switch ONEKERNEL_QKV_UNITS=0, since removed): in git history (`git show
# 87cef85:scripts/gpu_call.sh`); 271 + 275 replace them (274: the Qwen3 and SmolLM2 tables on the same kernels, not run yet).
# 280, 281, 282 (session 28: qkv_rope's once-per-tile RMSNorm swept and A/B'd in graph mode through the switch
# ONEKERNEL_QKV_BLOCKS, since removed; the L2 prefetch of its next chunks, dropped): in git history (`git show
# 170ba5f:scripts/gpu_call.sh`); 283 (gate_up's, A/B'd through ONEKERNEL_GATE_UP_BLOCKS, since removed: `git show
# 73e87c6:scripts/gpu_call.sh`). 290 (+ 274, the other tables) is session 28's final commit.
# 301 (session 29: both Llama tables with the folded attention merge, graph-fold / pdl-triton-fold, measured slower and
# reverted, so the case runs only there): in git history (`git show 0d5ad75:scripts/gpu_call.sh`); 300, 302, 303 and
# 304 are session 29's other calls.
# 320 + 321 (session 32: the publish stamp with knock-out probes, STREAM_PROBE, and the loader's in-flight bound,
# STREAM_INFLIGHT; neither kept): on branch s32-probe (`git show 8415e83:scripts/gpu_call.sh`); 322 (the publish stamp, the
# serving and long-cache tables before the split change); 323 (the split-KV size at 4096 positions, ONEKERNEL_ATTN_SPLIT,
# branch s32-split: `git show 1a3bb33:scripts/gpu_call.sh`); 324: session 32's final kernels; 330: prepared, not run.
# 331 (gate_up in one wave, rstd16 unrolled: neither kept) and 332 (SmolLM2's chunk columns 256 against 512: kept as
# stream_support.attn_cols; 331 also ran 330's long-cache tests) are on branches s33-ab (`git show 0fe106a:scripts/gpu_call.sh`)
# and s33-ck (`git show 8aec188:...`); 333-337: session 33's final commit (336 parks the GGUF's third part); 338: what CK
# 512 buys; 339: CK 1024 on the SmolLM2 models (run in session 34 with 340: not kept).
# 340 (session 34: gate_up's evened-out rows against the old tiles through ONEKERNEL_GATE_UP_ROWS=0; kept up to batch 8),
# 341 + 342 (session 35: the first rule's tables), 343 (megakernel profiles with the before-block-1 stamp), 345 (the 8B table at
# batch 1-16, the rule's limit at batch 2 / 4: batch 4 slower, so the limit went to 2), 346 (the final tables; 353 repeats
# it with the partials' checks: `git show 44b46fa:scripts/gpu_call.sh`); 347 (a knock-out probe of the rstd pass: branch s35-probe, `git show
# ebf3c11:scripts/gpu_call.sh`) and 344 (SPLIT 128 at the
# benchmark cache, not kept) is on branch s34-split (`git show c261453:scripts/gpu_call.sh`, the switch there).
# 356-362 (session 37: the closing run of issues 11 and 12: tables, checks, compile times, pdl partials A/B, the warm start
# under cProfile and with one gather per op). 356 replaces 306 (session 30's 1B / 8B tables with replays and invariance:
# `git show 1a82b87:scripts/gpu_call.sh`), 359 ran 355 (prepared in session 36), 362 repeats 361's starts (361: `git show
# 0e274c8:scripts/gpu_call.sh`).
# 348-352 (session 36: the RMSNorm partials, stream_plan.SS_PARTIALS, on and off) and 353 (session 36's final tables: the
# partials from hidden size 4096). 348 (`git show 525b28e:scripts/gpu_call.sh`, branch s36-partials-348), 349 (`git show
# ad56374:...`, branch s36-partials: the pointer loads before the wait, slower) and 350 (`git show f121516:...`, branch
# s36-gt: a GEMV task's fields loaded inside the non-attention branch, slower) are in git history; 351 + 352 run 525b28e's
# tree (.p348.tgz) with the partials on and off on Llama-3.1-8B; 354: pdl at batch 1 / 4 on and off; 355: prepared.
# 309 (session 30's STREAM_MMA_DEFER=1 A/B, run in session 31: slower, the switch removed): in git history (`git show
# 796d22f:scripts/gpu_call.sh`). 314: session 31's final commit. 310 (session 31: the 1B / 8B tables with the dead-tile skip on, whose first version,
# fns per block, was slower; `git show 0801cbb:scripts/gpu_call.sh`); 313: its A/B as a switch.
# 305 (session 30: the loader's L2 prefetch while the consumer waits on a dependency, STREAM_L2_CHAIN, slower, dropped;
# attention's first K/V block by cp.async, STREAM_ATTN_CP0=1, kept as the only path): in git history (`git show
# 8fc3cf5:scripts/gpu_call.sh`, the switches there); 306 + 307 + 308 are session 30's final commit.
# 242 = 211 then 212 in one command (give each step its limit; an outer `timeout` around 211 left its bench running).
# 214 + 215 (session 21: STREAM_EARLY_WAIT, the wait fields with the record and attention's first K/V block around the
# spin; none faster, the switch removed): in git history (`git show 6a4f3a8:scripts/gpu_call.sh`, the code at 84a3d2e).
# 110 + 111 (one H200, back to back; in git history, `git show e44b272:scripts/gpu_call.sh`; 160 + 161 replace them)
# and 112 (two): the final commits of sessions 11-14; 100 (its GEMV changes against main,
# by environment switches that are gone) and 101 (the raw-tile cp.async ring at batch <= 4: slower, reverted) are in
# git history (`git show 37f83c2:scripts/gpu_call.sh`, `git show f2fd7e2:...`).
# 60 + 393 (kind nvidia-h200-x4, back to back) and 61 + 394 (kind nvidia-h200-x8, back to back): issue 16, tensor
#    parallel at 4 and 8 GPUs (Llama-3.1-8B scaling TP=1/2/4/8; Llama-3.1-70B with random weights at TP=8). Run both
#    kinds on one commit; each TP check runs alone on its GPUs (session 40).
# Every step has its own time limit, so the call always ends with $OUT/results.tgz (all JSON, markdown,
# PNG and logs; the device tool returns at most 8 files) and $OUT/log.txt.
set -u
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ONEKERNEL_COMMIT=${ONEKERNEL_COMMIT:-}
# one Triton cache for every process: torch.compile (Inductor) otherwise moves a bench process's cache to its own
# directory, and the megakernel the warm-ups compiled is compiled again inside the timed process (run 14 call 110:
# both batch tables ran out of their steps' time before the batch-16 megakernel row)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
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
# A/B calls over trees: wtree LIMIT NAME DIR ENVS ARGS... warms `onekernel bench` of the tree in DIR (. or an unpacked
# tarball) with ENVS (one word, split here) in the background; ttree LIMIT NAME DIR ENVS ARGS... times it (a step,
# output under $W/NAME). Each process starts in its tree's directory, so it imports that tree's onekernel.
wtree() { local lim=$1 name=$2 dir=$3 envs=$4; shift 4; [ -d "$dir/onekernel" ] || return 0
          (cd "$dir" && timeout "$lim" env $envs PYTHONPATH=/tmp/site:$PWD python3 -m onekernel.cli bench --steps 2 \
           --out /tmp/warm/$name "$@" >"$W/warm-$name.log" 2>&1) & }
ttree() { local lim=$1 name=$2 dir=$3 envs=$4; shift 4; [ -d "$dir/onekernel" ] || return 0
          step "$lim" "$name" bash -c "cd $dir && env $envs PYTHONPATH=/tmp/site:$dir python3 -m onekernel.cli \
              bench --out $W/$name $* --steps 50"; }

# warm NAME ARGS...: warms `onekernel bench ARGS` of this tree in the background (WARM_S seconds, default 220; the log
# in $W/warm-NAME.log, what `checked` counts)
warm() { local name=$1; shift; (timeout "${WARM_S:-220}" python3 -m onekernel.cli bench --steps 2 --out /tmp/warm/$name \
         "$@" >"$W/warm-$name.log" 2>&1) & }
# checks LIMIT [TESTS]: bitwise invariance (Llama-3.2-1B megakernel at 2 / 8 / 16) and the streaming kernel's GPU tests
# (-k TESTS, default "mma or auto or fma": session 22's loader change broke only the CUDA-core kernels at batch >= 7,
# which the old default did not run; found on the CPU by a review, fixed, then call 223) in the background, beside a call's warm-ups; checked [N]: after `wait`, the
# warm-ups finished (of N) and every invariance log's and the tests' results into the log
checks() { (timeout "$1" python3 scripts/invariance_check.py llama-3.2-1b --modes megakernel --out "$W/inv-1b.json" \
            >"$W/inv-1b.log" 2>&1) &
           (timeout "$1" env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "${2:-mma or auto or fma}" \
            -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) & }
checked() { log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l)${1:+ of $1} benches finished"
            tail -n 3 "$W/gpu-tests.log" | tee -a "$OUT/log.txt"
            grep -h '"mode"' "$W"/inv-*.log | cut -c1-200 | tee -a "$OUT/log.txt"; }

# abab WARM_LIM TIME_LIM A B DIR ENV_A ENV_B ARGS...: an A/B of `onekernel bench ARGS` of the tree in DIR under ENV_A
# and ENV_B (one word each): both warmed at once (wtree), then each timed in its own process, A B A B (ttree; output
# under $W/A-1, $W/B-1, $W/A-2, $W/B-2)
abab() { local wl=$1 tl=$2 na=$3 nb=$4 dir=$5 ea=$6 eb=$7; shift 7
         mkdir -p /tmp/warm; wtree "$wl" "$na" "$dir" "$ea" "$@"; wtree "$wl" "$nb" "$dir" "$eb" "$@"; wait; checked 2
         for r in 1 2; do ttree "$tl" "$na-$r" "$dir" "$ea" "$@"; ttree "$tl" "$nb-$r" "$dir" "$eb" "$@"; done; }

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
case "$1" in
390) # issue 13's two-GPU run at one commit, 1 of 3 (written in session 39; kind nvidia-h200-x2; ~9 min: run it as
    # `(timeout 570 bash scripts/gpu_call.sh 390); tar -czf $OUT/results.tgz -C $OUT/w .`; 391 and 392 at once after
    # it on the warm machine). tp_check.py of Llama-3.2-1B, then of Llama-3.1-8B, one process per GPU (no other TP job
    # beside it: call 383's one-shot give-ups came with processes sharing a GPU): TP=2 against TP=1 in every TP mode
    # (torch+graph; eager, graph, pdl x nccl, symm, oneshot; the megakernel Triton, Gluon pull and Gluon push), batch
    # 1 and 8, 32 greedy steps, the forced timeouts; it compiles every kernel the benches of 391 need
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    log "GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
    mkdir -p "$W/tp"
    step 200 tp-check-1b python3 scripts/tp_check.py --models llama-3.2-1b --out "$W/tp/tp-check-llama-3.2-1b.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 330 tp-check-8b python3 scripts/tp_check.py --models llama-3.1-8b --out "$W/tp/tp-check-llama-3.1-8b.json"
    ;;
391) # 2 of 3, at once after 390 (warm x2 machine, ~7.5 min): `bench --tp 2` of Llama-3.2-1B and Llama-3.1-8B at batch
    # 1 and 8 (every TP mode and all-reduce, timed on both ranks: push vs pull against the 0.60x target, oneshot vs
    # symm vs nccl), then the two-GPU profiles of one TP=2 streaming megakernel step of Llama-3.1-8B at batch 1, pull
    # and push (both GPUs' SM timelines, the all-reduce tiles apart)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    mkdir -p "$W/bench" "$W/tp"
    step 120 bench-tp-1b $bench/bench --tp 2 --model llama-3.2-1b --random-weights --batch 1,8 --steps 100
    step 180 bench-tp-8b $bench/bench --tp 2 --model llama-3.1-8b --random-weights --batch 1,8 --steps 100
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 70 tp-profile-8b python3 scripts/tp_profile.py --model llama-3.1-8b --batch 1 --out "$W/tp"
    step 70 tp-profile-8b-push python3 scripts/tp_profile.py --model llama-3.1-8b --batch 1 --push --out "$W/tp"
    ;;
392) # 3 of 3, at once after 391 (~5.5 min): the TP=1 numbers of every mode at the same commit (Llama-3.2-1B on GPU 0
    # and Llama-3.1-8B on GPU 1 at once, batch 1 and 8), then the SM-reservation study (the Triton TP megakernel,
    # k = 0, 2, 4, 8, 16 reserved workers) on Llama-3.1-8B at batch 1
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    mkdir -p "$W/bench" "$W/tp"
    TP1="torch,torch+graph,eager,graph,pdl,megakernel"
    (step 180 bench-tp1-1b env CUDA_VISIBLE_DEVICES=0 $bench/bench --model llama-3.2-1b --random-weights \
        --batch 1,8 --modes $TP1 --steps 100) &
    (step 180 bench-tp1-8b env CUDA_VISIBLE_DEVICES=1 $bench/bench --model llama-3.1-8b --random-weights \
        --batch 1,8 --modes $TP1 --steps 100) &
    wait
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 120 tp-sm-study python3 scripts/tp_sm_study.py --model llama-3.1-8b --batches 1 --ks 0,2,4,8,16 \
        --ar-tiles fit --steps 100 --out "$W/tp"
    ;;
395) # session 40 (~8 min, one H200): one TP rank's step without its all-reduces (scripts/shard_bench.py): the rank
    # shard of Llama-3.1-8B at TP=2 (issue 13's 0.60x target: 2.37 ms against run 37's 3.942 ms TP=1 megakernel) and of
    # Llama-3.1-70B at TP=8 (issue 16's 70% of the 4.1 ms floor: 5.9 ms), batch 1 and 8, as models of their own: the
    # time a TP megakernel step would take if its all-reduces cost nothing
    mkdir -p "$W/shard"
    M="torch+graph,graph,pdl,megakernel"
    step 200 shard-8b-tp2 python3 scripts/shard_bench.py --model llama-3.1-8b --tp 2 --batch 1,8 --modes $M \
        --out "$W/shard/shard-8b-tp2.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 300 shard-70b-tp8 python3 scripts/shard_bench.py --model llama-3.1-70b --tp 8 --batch 1,8 --modes $M \
        --out "$W/shard/shard-70b-tp8.json"
    ;;
400) # session 41 (~1.5 min, one H200): the 70B TP=8 shard in a full 4096 cache at SPLIT 64 (choose_split's) and 128
    # (call 399: 32 lost 25% there; 37% of the floor at batch 8), batch 1 and 8, each its own process after warm-ups
    mkdir -p "$W/split" /tmp/warm
    sb="python3 scripts/shard_bench.py --model llama-3.1-70b --tp 8 --batch 1,8 --context 4096 --modes megakernel"
    for sp in 64 128; do
        (timeout 120 env ONEKERNEL_ATTN_SPLIT=$sp $sb --steps 2 --out /tmp/warm/70b-4096-$sp.json \
            >"$W/warm-70b-4096-$sp.log" 2>&1) &
    done
    wait
    for sp in 64 128; do
        step 50 shard-70b-4096-split$sp env ONEKERNEL_ATTN_SPLIT=$sp $sb --out "$W/split/70b-tp8-4096-split$sp.json"
    done
    ;;
398) # session 41 (~5 min, one H200): run 41's final table at one commit: 395's shards again (Llama-3.1-8B rank 0 of 2,
    # unchanged kernels; Llama-3.1-70B rank 0 of 8 with choose_split's SPLIT 32 for its 8-head groups), batch 1 and 8,
    # the four modes; the 70B-shard GPU test (2 layers, the default split); the 70B shard's profile at batch 1
    mkdir -p "$W/shard" "$W/profile" /tmp/warm
    M="torch+graph,graph,pdl,megakernel"
    (timeout 200 python3 scripts/shard_bench.py --model llama-3.1-70b --tp 8 --batch 1,8 --modes graph,pdl,megakernel \
        --steps 2 --out /tmp/warm/70b.json >"$W/warm-70b.log" 2>&1) &
    (timeout 200 python3 scripts/shard_bench.py --model llama-3.1-8b --tp 2 --batch 1,8 --modes graph,pdl,megakernel \
        --steps 2 --out /tmp/warm/8b.json >"$W/warm-8b.log" 2>&1) &
    (timeout 200 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "70b" -p no:cacheprovider \
        -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    log "warm-ups: $(ls /tmp/warm/*.json 2>/dev/null | wc -l) of 2 wrote; tests: $(tail -n 1 "$W/gpu-tests.log")"
    step 200 shard-8b-tp2 python3 scripts/shard_bench.py --model llama-3.1-8b --tp 2 --batch 1,8 --modes $M \
        --out "$W/shard/shard-8b-tp2.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 200 shard-70b-tp8 python3 scripts/shard_bench.py --model llama-3.1-70b --tp 8 --batch 1,8 --modes $M \
        --out "$W/shard/shard-70b-tp8.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 60 profile-70b-tp8-shard python3 scripts/stream_profile.py --model llama-3.1-70b --shard 8,0 --batch 1 \
        --out "$W/profile"
    ;;
396) # session 40 (~5 min, one H200): where the time of one TP rank's step goes without its all-reduces
    # (scripts/stream_profile.py --shard): Llama-3.1-70B's rank 0 of 8 (395: 6.02 ms against a 4.09 ms floor at batch
    # 1) and Llama-3.1-8B's rank 0 of 2 (2.22 ms against 1.77), batch 1; per-op times, attention's sub-stamps, PNG
    mkdir -p "$W/profile"
    step 200 profile-70b-tp8-shard python3 scripts/stream_profile.py --model llama-3.1-70b --shard 8,0 --batch 1 \
        --out "$W/profile"
    step 150 profile-8b-tp2-shard python3 scripts/stream_profile.py --model llama-3.1-8b --shard 2,0 --batch 1 \
        --out "$W/profile"
    ;;
385) # session 39 (~7 min, one H200; written in session 39, which was lent no machine): the one-shot all-reduce kernels'
    # final code (the rank read from memory: one kernel for every rank; the peers' rows read with volatile loads)
    # through tp_one_gpu.py, each run ALONE on the GPU (383 ran six processes at once): TP 2 eager and pdl on
    # Llama-3.2-1B batch 1 and 8 with the logits comparison that 383's harness bug lost; then TP 4 and TP 8 eager at
    # batch 1: if they still give up with the GPU to themselves, the cause is the ranks' separate kernels sharing
    # one GPU's SMs (not contention between processes); then the Triton megakernel at TP 2 (its all-reduce reads
    # are volatile loads now): reduced rows bitwise equal across ranks, logits against TP=1 as in 381
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    one="python3 scripts/tp_one_gpu.py --steps 8 --model llama-3.2-1b"
    step 90 one-1b-tp2-eager-oneshot $one --batches 1,8 --tp 2 --mode eager --opt allreduce=oneshot \
        --out "$W/one-1b-tp2-eager-oneshot.json"
    step 90 one-1b-tp2-pdl-oneshot $one --batches 1,8 --tp 2 --mode pdl --opt allreduce=oneshot \
        --out "$W/one-1b-tp2-pdl-oneshot.json"
    step 80 one-1b-tp4-eager-oneshot $one --batches 1 --tp 4 --mode eager --opt allreduce=oneshot \
        --out "$W/one-1b-tp4-eager-oneshot.json"
    step 80 one-1b-tp8-eager-oneshot $one --batches 1 --tp 8 --mode eager --opt allreduce=oneshot \
        --out "$W/one-1b-tp8-eager-oneshot.json"
    step 90 one-1b-tp2-triton $one --batches 1,8 --tp 2 --backend triton --out "$W/one-1b-tp2-triton.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    ;;
382) # session 38 (~4 min): onekernel's one-shot all-reduce kernels (--allreduce oneshot, dist/tp_oneshot.py) in the
    # separate-kernel modes eager and pdl (launched with PDL, no CUDA graph), ranks as threads on one H200
    # (scripts/tp_one_gpu.py): against TP=1 of the same mode, reduced rows bitwise equal across ranks, the forced
    # timeout naming peer rank 1; TP 2 / 4 / 8 on Llama-3.2-1B, TP 2 on Llama-3.1-8B; in parallel processes
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    one="python3 scripts/tp_one_gpu.py --batches 1,8 --steps 8 --opt allreduce=oneshot"
    for m in eager pdl; do for tp in 2 4 8; do
        (timeout 280 $one --mode $m --model llama-3.2-1b --tp $tp --out "$W/one-1b-tp$tp-$m-oneshot.json" \
            >"$W/one-1b-tp$tp-$m-oneshot.log" 2>&1) &
    done; done
    wait
    for f in "$W"/one-*.log; do log "$(basename "$f"): $(tail -n 3 "$f" | cut -c1-300)"; done
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 280 one-8b-tp2-pdl-oneshot $one --mode pdl --model llama-3.1-8b --tp 2 --out "$W/one-8b-tp2-pdl-oneshot.json"
    ;;
381) # session 38 (~5 min, after 380): the same harness at TP=4 and TP=8 on one H200 (33 and 16 workers a rank; the
    # code of issue 16's sizes, NR = 4 / 8 partials and peers, on hardware), pull and push, with the records' sha256 of
    # logits, tokens and reduced rows: push must give pull's bits at every TP size (also at TP=2: 380's records had no
    # hashes). In parallel processes (time-sliced; ms figures not used); more hardware queues than ranks
    export CUDA_DEVICE_MAX_CONNECTIONS=32
    one="python3 scripts/tp_one_gpu.py --batches 1,8 --steps 8"
    for tp in 2 4 8; do
        (timeout 280 $one --model llama-3.2-1b --tp $tp --out "$W/one-1b-tp$tp-pull.json" >"$W/one-1b-tp$tp-pull.log" 2>&1) &
        (timeout 280 $one --model llama-3.2-1b --tp $tp --opt push=True --out "$W/one-1b-tp$tp-push.json" \
            >"$W/one-1b-tp$tp-push.log" 2>&1) &
    done
    (timeout 280 $one --model llama-3.2-1b --tp 4 --backend triton --out "$W/one-1b-tp4-triton.json" \
        >"$W/one-1b-tp4-triton.log" 2>&1) &
    wait
    for f in "$W"/one-*.log; do log "$(basename "$f"): $(tail -n 3 "$f" | cut -c1-300)"; done
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 200 one-8b-tp4-pull $one --model llama-3.1-8b --tp 4 --batches 1 --out "$W/one-8b-tp4-pull.json"
    step 200 one-8b-tp4-push $one --model llama-3.1-8b --tp 4 --batches 1 --opt push=True --out "$W/one-8b-tp4-push.json"
    ;;
380) # session 38 (~6 min, one H200: no two-GPU kind lent): the tensor-parallel megakernel's device code with the TP=2
    # ranks as two threads of one process on ONE GPU (scripts/tp_one_gpu.py: 66 workers each, concurrent kernels, the
    # peer memory on the same GPU): the streaming kernel pull and push (push=True, new) and the Triton kernel on
    # Llama-3.2-1B, pull on Llama-3.1-8B, each against TP=1 of the same backend (logits, 16 greedy tokens, reduced
    # rows bitwise equal across ranks, the forced timeout naming peer rank 1), in parallel processes (time-sliced:
    # their ms figures are not used); then push on 8B alone, and 1B pull / push again one at a time (the ms figures
    # of one GPU shared by two ranks: not a TP speed)
    one="python3 scripts/tp_one_gpu.py --batches 1,8"
    (timeout 300 $one --model llama-3.2-1b --out "$W/one-1b-pull.json" >"$W/one-1b-pull.log" 2>&1) &
    (timeout 300 $one --model llama-3.2-1b --opt push=True --out "$W/one-1b-push.json" >"$W/one-1b-push.log" 2>&1) &
    (timeout 300 $one --model llama-3.2-1b --backend triton --out "$W/one-1b-triton.json" >"$W/one-1b-triton.log" 2>&1) &
    (timeout 300 $one --model llama-3.1-8b --out "$W/one-8b-pull.json" >"$W/one-8b-pull.log" 2>&1) &
    wait
    for f in one-1b-pull one-1b-push one-1b-triton one-8b-pull; do log "$f: $(tail -n 4 "$W/$f.log" | cut -c1-400)"; done
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 150 one-8b-push $one --model llama-3.1-8b --opt push=True --out "$W/one-8b-push.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 60 one-1b-pull-alone $one --model llama-3.2-1b --steps 4 --out "$W/one-1b-pull-alone.json"
    step 60 one-1b-push-alone $one --model llama-3.2-1b --steps 4 --opt push=True --out "$W/one-1b-push-alone.json"
    ;;
362) # session 37 (~3 min, a fresh machine): the weight stream packed by one gather per op (stream_pack.pack_weights; a
    # start made thousands of small launches, one set per task): the streaming GPU tests of the tensor-core path (against
    # the reference, each row its batch-1 run; both GEMV paths' streams), then 361's starts again
    mkdir -p "$W/compile"
    step 90 gpu-tests env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k \
        "matches_reference and (llama-3.2-1b-3-mma or llama-3.2-1b-3-fma)" -p no:cacheprovider -rfE
    step 200 compile python3 scripts/compile_times.py --out "$W/compile" --jobs 1 --timeout 90 --cases \
        llama-3.1-8b:16:megakernel,llama-3.1-8b:16:pdl
    ;;
360) # session 37 (~2.5 min, a fresh machine): where the warm start of Llama-3.1-8B's batch-16 megakernel goes (call 357:
    # 6.7 s, issue 12 asks <= 5 s; pdl 4.0 s): a cold start fills the caches, then the warm start under cProfile, both
    # runners
    export ONEKERNEL_CACHE=/tmp/okc
    for m in megakernel pdl; do
        step 90 start-8b-$m-cold python3 scripts/compile_times.py --child llama-3.1-8b 16 $m
        step 60 start-8b-$m-cprofile bash -c "python3 -m cProfile -s cumtime scripts/compile_times.py --child \
            llama-3.1-8b 16 $m | head -120"
    done
    ;;
356) # session 37's closing run, call 1 of 4 (~8.5 min; b85d206's kernels: no kernel source changed after it): warm-ups
    # of the Llama-3.2-1B table (batch 1-16, every mode and both PyTorch baselines) and the SmolLM2-135M table beside
    # 1,000 replays of graph / pdl / megakernel with the forced timeout and the bitwise batch invariance of every Triton
    # mode on Llama-3.2-1B (eager, graph, pdl, pdl-triton, megakernel at 2 / 8 / 16); then both tables
    mkdir -p "$W/bench" /tmp/warm
    B1="--model llama-3.2-1b --random-weights" S0="--model smollm2-135m --random-weights"
    MK="graph,pdl,pdl-triton,megakernel" MT="torch+graph,torch+compile" SM="torch+graph,graph,pdl,megakernel"
    WARM_S=200 warm 1b $B1 --batch 1,2,4,8,16 --modes $MK
    WARM_S=200 warm 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    WARM_S=200 warm smol $S0 --batch 1,2,4,8,16 --modes $SM
    WARM_S=200 warm smol-t $S0 --batch 8 --modes torch+compile
    (timeout 200 python3 scripts/replay_check.py --out "$W/replays-1b.json" >"$W/replays-1b.log" 2>&1) &
    (timeout 200 python3 scripts/invariance_check.py llama-3.2-1b --modes eager,graph,pdl,pdl-triton,megakernel \
        --out "$W/inv-1b.json" >"$W/inv-1b.log" 2>&1) &
    wait
    checked 4
    tail -n 4 "$W/replays-1b.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 200 bench-1b $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 90 bench-smol $bench/bench $S0 --batch 1,2,4,8,16 --modes $SM --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 40 bench-smol-tc $bench/bench $S0 --batch 8 --modes torch+compile --steps 50
    ;;
357) # session 37's closing run, call 2 of 4 (~6 min, at once after 356): the cold and warm start of five batch-16 cases
    # (fresh processes, an empty then the filled Triton cache, 2 at a time), then the per-op GEMV table (gpu_suite ops)
    # and one profiled Llama-3.2-1B megakernel step at batch 1 (the PNG issue 11 asks for) and at 16
    mkdir -p "$W/profile" "$W/compile"
    step 230 compile python3 scripts/compile_times.py --out "$W/compile" --jobs 2 --timeout 120 --cases \
        llama-3.2-1b:16:megakernel,llama-3.1-8b:16:megakernel,llama-3.2-1b:16:pdl,llama-3.1-8b:16:pdl,llama-3.2-1b:16:graph
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 120 ops $suite ops
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/ops.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 50 profile-1b-1 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    step 50 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
358) # session 37's closing run, call 3 of 4 (~5 min, at once after 357): 353's Llama-3.1-8B and Qwen3-8B tables, with the
    # bitwise batch invariance of the 8B megakernel, pdl, graph and pdl-triton (2 / 8 / 16) after the warm-ups
    mkdir -p "$W/bench" /tmp/warm
    B8="--model llama-3.1-8b --random-weights" Q8="--model qwen3-8b --random-weights"
    MK="torch+graph,graph,pdl,pdl-triton,megakernel"
    WARM_S=200 warm 8b-a $B8 --batch 1,2,4 --modes $MK
    WARM_S=200 warm 8b-b $B8 --batch 8,16 --modes $MK
    wait
    WARM_S=150 warm q8 $Q8 --batch 1,8 --modes $MK
    (timeout 150 python3 scripts/invariance_check.py llama-3.1-8b --modes megakernel,pdl,graph,pdl-triton \
        --out "$W/inv-8b.json" >"$W/inv-8b.log" 2>&1) &
    wait
    checked 3
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 150 bench-8b $bench/bench $B8 --batch 1,2,4,8,16 --modes $MK --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 90 bench-qwen3-8b $bench/bench $Q8 --batch 1,8 --modes $MK --steps 50
    ;;
359) # session 37's closing run, call 4 of 4 (~5 min, at once after 358): 355, pdl on Llama-3.1-8B at every batch with
    # the RMSNorm partials on and off, A B A B (the 8B caches warm from 358)
    abab 150 60 pon poff . X=0 STREAM_SS_PARTIALS=0 --model llama-3.1-8b --random-weights --batch 1,2,4,8,16 --modes pdl
    ;;
354) # after 353 (~4 min): 353's pdl rows at batch 1-4 read 1-1.5% slower than run 34's (7d7734c, another call) while its
    # megakernel rows did not move: pdl on Llama-3.1-8B at batch 1 / 4 with the partials on (X=0) and off
    # (STREAM_SS_PARTIALS=0), each its own process, A B A B
    abab 200 45 pon poff . X=0 STREAM_SS_PARTIALS=0 --model llama-3.1-8b --random-weights --batch 1,4 --modes pdl
    ;;
353) # session 36's final commit (~5 min): the RMSNorm partials on by default from hidden size 4096 (stream_plan.SS_MIN_D;
    # the smaller models' kernels have 44b46fa's PTX, scripts/ptx_compare.py). Warm-ups of the Llama-3.1-8B table (batch
    # 1-16, every mode but torch.compile) beside the partials GPU test (Llama-3.2-1B with STREAM_SS_PARTIALS=1: the
    # partials against float64 sums, the logits against the reference, each row bitwise its batch-1 run); then the bitwise
    # invariance of the 8B megakernel and pdl (batch 2 / 8 / 16, each row against its batch-1 run) beside the Qwen3-8B
    # warm-up; then both tables
    mkdir -p "$W/bench" /tmp/warm
    B8="--model llama-3.1-8b --random-weights" Q8="--model qwen3-8b --random-weights"
    MK="torch+graph,graph,pdl,pdl-triton,megakernel"
    WARM_S=240 warm 8b-a $B8 --batch 1,2,4 --modes $MK
    WARM_S=240 warm 8b-b $B8 --batch 8,16 --modes $MK
    (timeout 200 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "partials" -p no:cacheprovider \
        -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    WARM_S=200 warm q8 $Q8 --batch 1,8 --modes $MK
    (timeout 200 python3 scripts/invariance_check.py llama-3.1-8b --modes megakernel,pdl --out "$W/inv-8b.json" \
        >"$W/inv-8b.log" 2>&1) &
    wait
    checked 3
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 150 bench-8b $bench/bench $B8 --batch 1,2,4,8,16 --modes $MK --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 100 bench-qwen3-8b $bench/bench $Q8 --batch 1,8 --modes $MK --steps 50
    ;;
352) # at once after 351 (~3 min): the same A/B at batch 1 and 4, where rstd16 is one round trip (its 1-4 tiles unrolled)
    mkdir -p /tmp/p348
    [ -f .p348.tgz ] && tar -xzf .p348.tgz -C /tmp/p348
    abab 240 60 on14 off14 /tmp/p348 X=0 STREAM_SS_PARTIALS=0 --model llama-3.1-8b --random-weights --batch 1,4 \
        --modes megakernel
    ;;
351) # session 36 (~5 min): the RMSNorm partials of branch s36-partials-348 (.p348.tgz = `git archive 525b28e onekernel
    # scripts`) on Llama-3.1-8B, where rstd16 loops over 4 k-chunks at batch 8 and 16 (4 dependent L2 round trips a
    # task, 1B: 2 at batch 16): the megakernel at batch 8 / 16 with the partials on (X=0) and off
    # (STREAM_SS_PARTIALS=0), each its own process, A B A B
    mkdir -p /tmp/p348
    [ -f .p348.tgz ] && tar -xzf .p348.tgz -C /tmp/p348
    abab 240 60 on off /tmp/p348 X=0 STREAM_SS_PARTIALS=0 --model llama-3.1-8b --random-weights --batch 8,16 \
        --modes megakernel
    ;;
343) # session 35 (~3 min): where the megakernel's GEMV tasks spend their fixed time, with the "before block 1" stamp
    # (session 30, never run): profiles of SmolLM2-135M at batch 1 and 16 and Llama-3.2-1B at batch 1 and 16, compiled
    # in parallel first
    mkdir -p /tmp/warm "$W/profile"
    ps="python3 scripts/stream_profile.py --model smollm2-135m --gemv mma" pl="python3 scripts/stream_profile.py --model llama-3.2-1b"
    for b in 1 16; do (timeout 200 $ps --batch $b --out /tmp/warm/s$b >"$W/warm-s$b.log" 2>&1) &
        (timeout 200 $pl --batch $b --out /tmp/warm/l$b >"$W/warm-l$b.log" 2>&1) & done
    wait
    for b in 1 16; do step 60 profile-smol-$b $ps --batch $b --out "$W/profile"; step 60 profile-1b-$b $pl --batch $b \
        --out "$W/profile"; done
    ;;
345) # session 35 (~6 min; 75940d0's kernels): the Llama-3.1-8B table at batch 1 / 2 / 4 / 8 / 16 in one process (issue
    # 12's must-show; 341 ran 1 / 8 / 16), then graph at batch 2 / 4 with the old gate_up tiles (ONEKERNEL_GATE_UP_ROWS=0) and
    # with the rule's, each its own process, A B A B: the rule's batch limit at the batches 340 did not measure
    mkdir -p "$W/bench" /tmp/warm
    B8="--model llama-3.1-8b --random-weights"
    MK="torch+graph,graph,pdl,pdl-triton,megakernel"
    G24="--model llama-3.1-8b --random-weights --batch 2,4 --modes graph"
    WARM_S=240 warm 8b-a $B8 --batch 1,2,4 --modes $MK
    WARM_S=240 warm 8b-b $B8 --batch 8,16 --modes $MK
    wait
    checked 2
    wtree 120 g0 . ONEKERNEL_GATE_UP_ROWS=0 $G24
    wait
    step 200 bench-8b $bench/bench $B8 --batch 1,2,4,8,16 --modes $MK --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    for r in 1 2; do ttree 40 g1-$r . X=0 $G24; ttree 40 g0-$r . ONEKERNEL_GATE_UP_ROWS=0 $G24; done
    ;;
341) # session 35, the first rule (rows up to batch 8), call 1 of 2 (~7 min): the Llama-3.1-8B table (every mode but torch.compile, batch 1 / 8 /
    # 16) after its warm-ups, beside them tests/test_mma_gpu.py's gate_up tests (the rows across tiling.gate_up_rows' batch
    # limit bitwise) and the bitwise batch invariance of graph and pdl-triton on Llama-3.1-8B (batch 2 and 8 take the
    # evened-out rows, 16 the power-of-two tiles; each row against its batch-1 run)
    mkdir -p "$W/bench" /tmp/warm
    B8="--model llama-3.1-8b --random-weights"
    MK="graph,pdl,pdl-triton,megakernel"
    WARM_S=220 warm 8b $B8 --batch 1,8 --modes torch+graph,$MK
    WARM_S=220 warm 8b-16 $B8 --batch 16 --modes torch+graph,$MK
    (timeout 220 python3 scripts/invariance_check.py llama-3.1-8b --modes graph,pdl-triton --out "$W/inv-8b.json" \
        >"$W/inv-8b.log" 2>&1) &
    (timeout 220 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_mma_gpu.py -k "gate_up" -p no:cacheprovider \
        -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 2
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 160 bench-8b $bench/bench $B8 --batch 1,8,16 --modes torch+graph,$MK --steps 50
    ;;
342) # session 35, the first rule, call 2 of 2 (~6 min; at once after 341 or cold): the Qwen3-8B table at batch 1 and 8
    # (torch+graph and every Triton mode; torch.compile's rows stay run 29's: its warm-up alone takes minutes)
    mkdir -p "$W/bench" /tmp/warm
    Q8="--model qwen3-8b --random-weights"
    MK="graph,pdl,pdl-triton,megakernel"
    WARM_S=230 warm q8-1 $Q8 --batch 1 --modes torch+graph,$MK
    WARM_S=230 warm q8-8 $Q8 --batch 8 --modes torch+graph,$MK
    wait
    checked 2
    step 170 bench-qwen3-8b $bench/bench $Q8 --batch 1,8 --modes torch+graph,$MK --steps 50
    ;;
340) # session 34 (~6 min): gate_up's rows evened out over two CTAs a SM on the separate kernels' tensor-core path
    # (ops.tiling.gate_up_rows: Llama-3.1-8B 224 tiles of 64 rows -> 256 of 56, Qwen3-8B 192 of 64 -> 256 of 48) against
    # the old tiles (ONEKERNEL_GATE_UP_ROWS=0): gemv_sweep.py's gate_up (every layer's op back to back, L2 flushed) at
    # batch 1 and 16, then Llama-3.1-8B graph at batch 1 / 8 / 16, each its own process, A B A B
    mkdir -p /tmp/warm
    V='[[{}, 4], [{"BLOCK_N": 64}, 4]]'
    L8="--model llama-3.1-8b --random-weights --batch 1,8,16 --modes graph"
    wtree 240 gA . ONEKERNEL_GATE_UP_ROWS=1 $L8; wtree 240 gB . ONEKERNEL_GATE_UP_ROWS=0 $L8
    wait
    checked 2
    for b in 1 16; do step 100 sweep-b$b python3 scripts/gemv_sweep.py --models llama-3.1-8b,qwen3-8b --kinds gate_up \
        --batch $b --variants "$V" --out "$W/sweep-gate_up-b$b.json"; done
    for r in 1 2; do ttree 90 gA$r . ONEKERNEL_GATE_UP_ROWS=1 $L8; ttree 90 gB$r . ONEKERNEL_GATE_UP_ROWS=0 $L8; done
    ;;
339) # prepared in session 33, run in session 34 (~2.5 min; not kept): CK 1024 on the SmolLM2 models (chunks of 8 rows: each GEMV stage over
    # twice the workers again; K = 576 / 960 padded to 1024 as at CK 512, SmolLM2-135M's 1536 to 2048; ATTN_TC 2; compiles
    # on the CPU with 0 / 24 bytes of spills at batch 1 / 16): this tree (CK 512) against branch s33-ck's tree
    # (.ck.tgz = `git archive 8aec188 onekernel scripts`) with STREAM_CK=1024, the megakernel at batch 1 / 8 / 16, each
    # its own process, A B A B
    mkdir -p /tmp/warm /tmp/ck
    [ -f .ck.tgz ] && tar -xzf .ck.tgz -C /tmp/ck
    S1="--model smollm2-135m --random-weights --batch 1,8,16 --modes megakernel"
    S3="--model smollm2-360m --random-weights --batch 1,8,16 --modes megakernel"
    wtree 150 a . X=0 $S1; wtree 150 b /tmp/ck STREAM_CK=1024 $S1; wtree 150 a3 . X=0 $S3; wtree 150 b3 /tmp/ck STREAM_CK=1024 $S3
    wait
    checked 4
    for r in 1 2; do ttree 30 a$r . X=0 $S1; ttree 30 b$r /tmp/ck STREAM_CK=1024 $S1; done
    ttree 30 a3 . X=0 $S3; ttree 30 b3 /tmp/ck STREAM_CK=1024 $S3
    ;;
338) # session 33 (~2 min): what CK 512 buys SmolLM2-135M, its tensor-core attention or its 16-row chunks: this tree (CK
    # 512, ATTN_TC 1) against branch s33-ck's tree (.ck.tgz = `git archive 8aec188 onekernel scripts`, unpacked to
    # /tmp/ck) with STREAM_CK=512 STREAM_ATTN_TC=0 (CK 512, the CUDA-core attention) and as it is (CK 256, the CUDA-core
    # attention: main before session 33), the megakernel at batch 1 / 8 / 16, each its own process, A B C A B C
    mkdir -p /tmp/warm /tmp/ck
    [ -f .ck.tgz ] && tar -xzf .ck.tgz -C /tmp/ck
    S1="--model smollm2-135m --random-weights --batch 1,8,16 --modes megakernel"
    wtree 150 a . X=0 $S1; wtree 150 b /tmp/ck "STREAM_CK=512 STREAM_ATTN_TC=0" $S1; wtree 150 c /tmp/ck X=0 $S1
    wait
    checked 3
    for r in 1 2; do ttree 30 a$r . X=0 $S1; ttree 30 b$r /tmp/ck "STREAM_CK=512 STREAM_ATTN_TC=0" $S1
        ttree 30 c$r /tmp/ck X=0 $S1; done
    ;;
337) # session 33 (~3.5 min): branch s33-merge's deferred warp merges (.merge.tgz = `git archive 9f10871 onekernel
    # scripts`, STREAM_ATTN_DEFER=2) against this tree, the Llama-3.2-1B megakernel at batch 1 / 8 / 16, each its own
    # process, A B A B, with a bitwise logits_dump A/B at batch 16; SmolLM2-135M's streaming profile at batch 1 and 16
    mkdir -p /tmp/warm /tmp/merge "$W/profile"
    [ -f .merge.tgz ] && tar -xzf .merge.tgz -C /tmp/merge
    M1="--model llama-3.2-1b --random-weights --batch 1,8,16 --modes megakernel"
    prof="python3 scripts/stream_profile.py --model smollm2-135m --gemv mma"
    wtree 200 k0 . X=0 $M1; wtree 200 k2 /tmp/merge STREAM_ATTN_DEFER=2 $M1
    (timeout 150 $prof --batch 1 --out /tmp/warm/p1 >"$W/warm-p1.log" 2>&1; \
     timeout 100 $prof --batch 16 --out /tmp/warm/p16 >"$W/warm-p16.log" 2>&1) &
    wait
    checked 2
    ttree 40 k0 . X=0 $M1; ttree 40 k2 /tmp/merge STREAM_ATTN_DEFER=2 $M1
    ttree 40 k0b . X=0 $M1; ttree 40 k2b /tmp/merge STREAM_ATTN_DEFER=2 $M1
    tar -czf "$OUT/results.tgz" -C "$W" .
    dump="scripts/logits_dump.py --model llama-3.2-1b --batch 16"
    step 40 dump-main python3 $dump "$W/d-main.pt"
    step 40 dump-defer bash -c "cd /tmp/merge && env STREAM_ATTN_DEFER=2 PYTHONPATH=/tmp/site:/tmp/merge python3 $dump $W/d-defer.pt"
    step 20 dump-compare python3 scripts/logits_dump.py --compare "$W/d-main.pt" "$W/d-defer.pt"
    rm -f "$W"/d-*.pt
    step 30 profile-smol-1 $prof --batch 1 --out "$W/profile"
    step 30 profile-smol-16 $prof --batch 16 --out "$W/profile"
    ;;
333) # session 33's final commit, call 1 of 4 (~5 min; carry .model/smolgz4.00, parked for 335; the tracked tree is 39 MB
    # now, so the gzipped GGUF travels in four parts of 23 MB: `split -n 4 -d smol.gguf.gz .model/smolgz4.`): warm-ups of
    # the SmolLM2-135M tables beside its megakernel's bitwise invariance and the streaming GPU tests of SmolLM2 (CK 512:
    # attention on the tensor cores); then the SmolLM2-135M table (batch 1-16; torch+graph, graph, pdl, megakernel) and
    # its serving table (4096 positions, 512 filled). (Cut after a machine was taken back mid-call with 787 s left: the
    # Triton megakernel's column, the deferred-merge branch A/B and SmolLM2-360M's long cache.)
    cp .model/smolgz4.00 /tmp/model/ 2>/dev/null
    mkdir -p "$W/bench" /tmp/warm
    B0="--model smollm2-135m --random-weights --batch 1,2,4,8,16 --modes torch+graph,graph,pdl,megakernel"
    FS="--model smollm2-135m --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    WARM_S=200 warm smol $B0; WARM_S=200 warm fs $FS
    (timeout 200 python3 scripts/invariance_check.py smollm2-135m --modes megakernel --out "$W/inv-smol.json" \
        >"$W/inv-smol.log" 2>&1) &
    (timeout 200 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "smollm2" -p no:cacheprovider \
        -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 2
    step 90 bench-smol $bench/bench $B0 --steps 50
    step 50 bench-smol-fill $bench/bench $FS --steps 50
    ;;
334) # at once after 333 (warm machine; carry .model/smolgz4.01; ~1.5 min): 1,000 replays and the forced timeout of
    # SmolLM2-135M
    cp .model/smolgz4.01 /tmp/model/ && log "parked: $(ls /tmp/model)"
    step 90 replays-smol python3 scripts/replay_check.py --model smollm2-135m --out "$W/replays-smol.json"
    ;;
336) # at once after 334 (carry .model/smolgz4.02; seconds): the GGUF's third part parked
    cp .model/smolgz4.02 /tmp/model/ && log "parked: $(ls /tmp/model)"
    ;;
335) # at once after 336 (carry .model/smolgz4.03; ~3 min): the default GGUF joined; its greedy tokens (5 prompts
    # alone and together, every mode and the reference), then its table at batch 1 and 8
    cat /tmp/model/smolgz4.00 /tmp/model/smolgz4.01 /tmp/model/smolgz4.02 .model/smolgz4.03 | gunzip >"$GGUF" \
        && log "model joined: $(stat -c %s "$GGUF") bytes"
    mkdir -p "$W/bench-real"
    MK="graph,pdl,megakernel"
    step 150 greedy-real python3 scripts/greedy_tokens.py "$GGUF" "$W/greedy-real.json"
    step 60 bench-135m $bench/bench-real --model "$GGUF" --batch 1,8 --modes torch+graph,$MK --steps 50
    ;;
330) # prepared in session 32, not run yet (~5 min): what session 32 changed without a GPU run of its own. The long-cache
    # GPU tests (Llama-3.2-1B at 4096: SPLIT 128 with the dead-tile walk) alone with 1B warm-ups; SmolLM2-360M with a
    # full 4096 cache (SPLIT 128 since session 32) and SmolLM2-135M at 4096 / 512 filled (SPLIT 64, unchanged) as tables
    mkdir -p "$W/bench" /tmp/warm
    M3="--model smollm2-360m --random-weights --context 4096 --batch 1,8,16 --modes graph,pdl,megakernel"
    WARM_S=200 warm m3 $M3
    (timeout 300 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "dead" -p no:cacheprovider -rfE \
        >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 1
    step 60 bench-360m-4096 $bench/bench $M3 --steps 50
    ;;
324) # session 32 (~5.5 min, 6d620a9): choose_split's 2 waves then for every head dim (SPLIT 128 at 4096 positions for 8 KV
    # heads); the final rule keeps them for head dims <= 64 above 2048 positions, so l8 and b8 build the same 8B kernels. Llama-3.2-1B with a full 4096-position cache and with 512 of 4096 filled
    # (graph, pdl, megakernel at batch 1 / 8 / 16); Llama-3.1-8B with a full 4096 cache (megakernel at batch 1 / 8)
    # beside the tree before the change (SPLIT 64; .base.tgz, unpacked to /tmp/basetree when it travels), each its own
    # process
    mkdir -p /tmp/warm /tmp/basetree
    [ -f .base.tgz ] && tar -xzf .base.tgz -C /tmp/basetree
    L1="--model llama-3.2-1b --random-weights --context 4096 --batch 1,8,16 --modes graph,pdl,megakernel"
    F1="--model llama-3.2-1b --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    L8="--model llama-3.1-8b --random-weights --context 4096 --batch 1,8 --modes megakernel"
    wtree 150 l1 . X=0 $L1; wtree 150 f1 . X=0 $F1; wtree 150 l8 . X=0 $L8; wtree 150 b8 /tmp/basetree X=0 $L8
    wait
    checked 4
    ttree 60 l1 . X=0 $L1; ttree 45 f1 . X=0 $F1
    tar -czf "$OUT/results.tgz" -C "$W" .
    ttree 50 b8 /tmp/basetree X=0 $L8; ttree 50 l8 . X=0 $L8
    ;;
322) # session 32's final commit (~6 min): the profile's new publish stamp on Llama-3.2-1B batch 1 (and, from the probe
    # branch's tree in .probe.tgz when it travels, the loader's in-flight bound STREAM_INFLIGHT=1 and 2: does the
    # release fence wait for the weight copies in flight?); the serving-cache table (4096 positions, 512 filled) of
    # Llama-3.2-1B and SmolLM2-135M; Llama-3.2-1B with a full 4096-position cache
    mkdir -p "$W/bench" "$W/prof" /tmp/warm /tmp/probe
    [ -f .probe.tgz ] && tar -xzf .probe.tgz -C /tmp/probe
    F1="--model llama-3.2-1b --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    FS="--model smollm2-135m --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    L1="--model llama-3.2-1b --random-weights --context 4096 --batch 1,8,16 --modes graph,pdl,megakernel"
    prof="python3 scripts/stream_profile.py --model llama-3.2-1b --batch 1"
    WARM_S=200 warm f1 $F1; WARM_S=200 warm fs $FS; WARM_S=200 warm l1 $L1
    (timeout 200 $prof --out /tmp/warm/p >"$W/warm-p.log" 2>&1) &
    for n in 1 2; do [ -d /tmp/probe/onekernel ] && (cd /tmp/probe && timeout 200 env STREAM_INFLIGHT=$n \
        PYTHONPATH=/tmp/site:/tmp/probe $prof --out /tmp/warm/p$n >"$W/warm-p$n.log" 2>&1) & done
    wait
    checked 3
    step 40 profile-1b-1 $prof --out "$W/prof/main"
    for n in 1 2; do [ -d /tmp/probe/onekernel ] && step 40 profile-inflight$n bash -c "cd /tmp/probe && env \
        STREAM_INFLIGHT=$n PYTHONPATH=/tmp/site:/tmp/probe $prof --out $W/prof/inflight$n"; done
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 70 bench-1b-fill $bench/bench $F1 --steps 50
    step 50 bench-smol-fill $bench/bench $FS --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 100 bench-1b-4096 $bench/bench $L1 --steps 50
    ;;
314) # session 31's final commit (~4 min): the dead-tile skip by cache length (STREAM_ATTN_SKIP=auto, the default: caches
    # of >= 16 splits per KV head). The GPU tests that 313 ran out of time for (the long-cache tests, which take the
    # skip by default, auto, pdl, Qwen3-0.6B batch 16) beside the warm-ups; the serving-cache table (4096 positions,
    # 512 filled) of Llama-3.2-1B and SmolLM2-135M; Llama-3.2-1B at a full cache of 1024 (the threshold; nothing dead)
    # with and without the skip
    mkdir -p "$W/bench" /tmp/warm
    F1="--model llama-3.2-1b --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    FS="--model smollm2-135m --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    C1="--model llama-3.2-1b --random-weights --context 1024 --batch 1,8,16 --modes megakernel,pdl"
    WARM_S=170 warm f1 $F1
    WARM_S=170 warm fs $FS
    wtree 170 c1 . STREAM_ATTN_SKIP=auto $C1; wtree 170 c0 . STREAM_ATTN_SKIP=0 $C1
    (timeout 170 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py \
        -k "dead or auto or pdl_takes or qwen3-0.6b-16" -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 4
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 60 bench-1b-fill $bench/bench $F1 --steps 50
    step 45 bench-smol-fill $bench/bench $FS --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    ttree 40 c1024-skip . STREAM_ATTN_SKIP=auto $C1; ttree 40 c1024-noskip . STREAM_ATTN_SKIP=0 $C1
    ;;
313) # session 31 (~7 min): attention skipping its dead split-KV tiles (STREAM_ATTN_SKIP=1, exec/stream_attn_runs) against
    # the kernels without it (STREAM_ATTN_SKIP=0, the default: main's PTX), each variant its own process: the GPU tests
    # and the bitwise A/B of one step with the switch on (beside the warm-ups), then Llama-3.2-1B at context 512 (the
    # tables' case: no dead tile) A B A B, Llama-3.1-8B at 512, and a serving-sized cache (4096 positions, 512 filled)
    # on Llama-3.2-1B, SmolLM2-135M (the CUDA-core attention) and Llama-3.1-8B
    mkdir -p /tmp/warm
    S1="--model llama-3.2-1b --random-weights --modes megakernel,pdl --batch 1,8,16"
    S8="--model llama-3.1-8b --random-weights --modes megakernel --batch 1,8"
    F1="--model llama-3.2-1b --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    FS="--model smollm2-135m --random-weights --context 4096 --fill 512 --batch 1,8,16 --modes graph,pdl,megakernel"
    F8="--model llama-3.1-8b --random-weights --context 4096 --fill 512 --batch 1,8 --modes graph,megakernel"
    V0="STREAM_ATTN_SKIP=0" V1="STREAM_ATTN_SKIP=1"
    wtree 200 s0 . "$V0" $S1; wtree 200 s1 . "$V1" $S1; wtree 200 f0 . "$V0" $F1; wtree 200 f1 . "$V1" $F1
    wtree 200 fs0 . "$V0" $FS; wtree 200 fs1 . "$V1" $FS; wtree 200 e0 . "$V0" $S8; wtree 200 e1 . "$V1" $S8
    (timeout 200 env TRITON_INTERPRET=0 STREAM_ATTN_SKIP=1 python3 -m pytest -q tests/test_stream_gpu.py \
        -k "mma or dead or fma" -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) &
    (for c in "llama-3.2-1b 3 448" "llama-3.2-1b 16 448" "llama-3.2-1b 8 2048" "smollm2-135m 8 2048"; do set -- $c
         for v in 1 0; do timeout 45 env STREAM_ATTN_SKIP=$v python3 scripts/logits_dump.py "$W/d$v-$1-$2-$3.pt" \
             --model $1 --batch $2 --context $3 >"$W/dump-$v-$1-$2-$3.log" 2>&1; done; done) &
    wait
    checked 8
    for c in llama-3.2-1b-3-448 llama-3.2-1b-16-448 llama-3.2-1b-8-2048 smollm2-135m-8-2048; do
        python3 scripts/logits_dump.py --compare "$W/d1-$c.pt" "$W/d0-$c.pt" 2>&1 | tail -1 | tee -a "$OUT/log.txt"; done
    rm -f "$W"/*.pt
    tar -czf "$OUT/results.tgz" -C "$W" .
    ttree 40 std0 . "$V0" $S1; ttree 40 std1 . "$V1" $S1; ttree 40 std0b . "$V0" $S1; ttree 40 std1b . "$V1" $S1
    tar -czf "$OUT/results.tgz" -C "$W" .
    ttree 60 fill0 . "$V0" $F1; ttree 60 fill1 . "$V1" $F1
    ttree 45 fills0 . "$V0" $FS; ttree 45 fills1 . "$V1" $FS
    tar -czf "$OUT/results.tgz" -C "$W" .
    ttree 45 std8-0 . "$V0" $S8; ttree 45 std8-1 . "$V1" $S8
    ;;
308) # session 30's final commit, call 3 (~4.5 min): 1,000 replays of graph / pdl / megakernel at batch 1 and 8 with the
    # forced timeout (306's ran out of GPU memory beside the warm-ups) beside the warm-up of Qwen3-8B's batch-8 rows, which
    # 307 ran out of time for (torch.compile's warm-up), then those rows
    mkdir -p "$W/bench" /tmp/warm
    Q8="--model qwen3-8b --random-weights --batch 8 --modes graph,pdl,pdl-triton,megakernel"
    WARM_S=150 warm q8 $Q8
    (timeout 150 python3 scripts/replay_check.py --out "$W/replays-1b.json" >"$W/replays-1b.log" 2>&1) &
    wait
    checked 1
    tail -n 4 "$W/replays-1b.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 80 bench-qwen3-8b-8 $bench/bench $Q8 --steps 50
    ;;
307) # session 30's final commit, call 2 of 3 (~7.5 min, at once after 306): the Qwen3-0.6B and Qwen3-8B tables (their
    # streaming attention changed too) and one profiled Llama-3.2-1B megakernel step at batch 1 (the PNG issue 11 asks for)
    mkdir -p "$W/bench" "$W/profile" /tmp/warm
    Q0="--model qwen3-0.6b --random-weights --batch 1,2,4,8,16 --modes torch+graph,graph,pdl,pdl-triton,megakernel"
    Q8="--model qwen3-8b --random-weights --batch 1,8 --modes torch+graph,torch+compile,graph,pdl,pdl-triton,megakernel"
    WARM_S=200 warm q0 $Q0
    WARM_S=200 warm q8 $Q8
    (timeout 200 python3 scripts/invariance_check.py qwen3-0.6b --modes megakernel,pdl --out "$W/inv-qwen3-0.6b.json" \
        >"$W/inv-qwen3-0.6b.log" 2>&1) &
    wait
    checked 2
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 110 bench-qwen3-0.6b $bench/bench $Q0 --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 110 bench-qwen3-8b $bench/bench $Q8 --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 45 profile-1b-1 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    ;;
304) # session 29 (~2.5 min): Qwen3-0.6B on its new default path (the tensor cores, MMA_MIN_DIM 1024): bitwise batch
    # invariance at 2 / 8 / 16 in eager, graph, pdl (its streaming bodies), pdl-triton and the megakernel
    step 170 inv-qwen3-0.6b python3 scripts/invariance_check.py qwen3-0.6b --modes eager,graph,pdl,pdl-triton,megakernel \
        --out "$W/inv-qwen3-0.6b.json"
    grep -h '"mode"' "$W"/inv-*.log | cut -c1-200 | tee -a "$OUT/log.txt"
    ;;
303) # session 29 (~6.5 min): SmolLM2-135M and Qwen3-0.6B (random weights) at batch 1-16 with their separate kernels on
    # the tensor cores (graph-mma, pdl-mma, pdl-triton-mma) beside their default CUDA-core path (graph, pdl), one process
    # per model: the A/B for default_gemv's MMA_MIN_DIM, and the rows of call 300's tables that ran out of time
    mkdir -p "$W/bench" /tmp/warm
    S="--model smollm2-135m --random-weights"
    Q="--model qwen3-0.6b --random-weights"
    SM="torch+graph,graph,pdl,graph-mma,pdl-mma,pdl-triton-mma,megakernel,megakernel-triton"
    QM="torch+graph,graph,pdl,graph-mma,pdl-mma,pdl-triton-mma,megakernel"
    WARM_S=170 warm s-a $S --batch 1,2,4 --modes $SM
    WARM_S=170 warm s-b $S --batch 8,16 --modes $SM
    WARM_S=170 warm q-a $Q --batch 1,2,4 --modes $QM
    WARM_S=170 warm q-b $Q --batch 8,16 --modes $QM
    (timeout 170 python3 scripts/invariance_check.py smollm2-135m --modes graph-mma,pdl-mma \
        --out "$W/inv-smol-mma.json" >"$W/inv-smol-mma.log" 2>&1) &
    wait
    checked 4
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 110 bench-smol $bench/bench $S --batch 1,2,4,8,16 --modes $SM --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 110 bench-qwen3-0.6b $bench/bench $Q --batch 1,2,4,8,16 --modes $QM --steps 50
    ;;
302) # session 29's final commit, call 2 of 2 (~4 min, at once after 301 or cold): the per-op GEMV table (gpu_suite ops:
    # every layer's op of a kind in one CUDA graph, L2 flushed, against the copy bandwidth of the same run) and one
    # profiled Llama-3.2-1B megakernel step at batch 1 (the PNG issue 11 asks for) and at 16
    mkdir -p "$W/profile"
    step 120 ops $suite ops
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/ops.json"
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 60 profile-1b-1 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    step 60 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
300) # session 29's first call (~8.5 min): the three tables run 28 left at runs 25 / 26 (Qwen3-8B, SmolLM2-135M and
    # Qwen3-0.6B, random weights, 274's rows) on today's kernels, and pdl on the Triton per-op kernels with each kernel's
    # dependent launched right after its gdc_wait (pdl-triton-wait) beside the default trigger after the body, Llama-3.2-1B
    # and Llama-3.1-8B at batch 1 / 8 / 16; the tensor-core gate_up GPU tests (b_gate_up_wave's bf16 comparison never ran)
    mkdir -p /tmp/warm "$W/bench"
    Q8="--model qwen3-8b --random-weights --batch 1,8 --modes torch+graph,torch+compile,graph,pdl,pdl-triton,megakernel"
    B0="--model smollm2-135m --random-weights --batch 1,2,4,8,16 --modes torch+graph,torch+compile,graph,pdl,megakernel,megakernel-triton"
    Q0="--model qwen3-0.6b --random-weights --batch 1,2,4,8,16 --modes torch+graph,torch+compile,graph,pdl,megakernel"
    T1="--model llama-3.2-1b --random-weights --batch 1,8,16 --modes graph,pdl-triton,pdl-triton-wait"
    T8="--model llama-3.1-8b --random-weights --batch 1,8,16 --modes graph,pdl-triton,pdl-triton-wait"
    WARM_S=180 warm q8 $Q8
    WARM_S=180 warm smol $B0
    WARM_S=180 warm q0 $Q0
    WARM_S=180 warm t1 $T1
    WARM_S=180 warm t8 $T8
    (timeout 180 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_mma_gpu.py -k "gate_up" -p no:cacheprovider \
        -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 5
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 60 trig-1b $bench/bench $T1 --steps 50
    step 70 trig-8b $bench/bench $T8 --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 90 bench-qwen3-8b $bench/bench $Q8 --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 70 bench-smol $bench/bench $B0 --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 70 bench-qwen3-0.6b $bench/bench $Q0 --steps 50
    ;;
290) # session 28's final commit (~7 min): warm-ups of the Llama-3.2-1B and Llama-3.1-8B tables (every mode; graph, eager and
    # pdl-triton with the once-per-tile RMSNorm of qkv_rope and, on 1B, gate_up) beside 1,000 replays of graph / pdl /
    # megakernel with the forced timeout and the tensor-core qkv / gate_up GPU tests; then both tables. The invariance of
    # these kernels ran in call 283.
    mkdir -p "$W/bench" /tmp/warm
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    MK="graph,pdl,pdl-triton,megakernel" MT="torch+graph,torch+compile"
    WARM_S=170 warm 1b $B1 --batch 1,2,4,8,16 --modes $MK
    WARM_S=170 warm 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    WARM_S=170 warm 8b $B8 --batch 1,8 --modes $MK
    WARM_S=170 warm 8b-16 $B8 --batch 16 --modes $MK
    (timeout 170 python3 scripts/replay_check.py --out "$W/replays-1b.json" >"$W/replays-1b.log" 2>&1) &
    (timeout 170 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_mma_gpu.py -k "qkv or gate_up" -p no:cacheprovider \
        -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 4
    tail -n 4 "$W/replays-1b.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    tar -czf "$OUT/results.tgz" -C "$W" .  # after every step: a call cut short still brings its tables back
    step 140 bench-1b $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50
    tar -czf "$OUT/results.tgz" -C "$W" .
    step 100 bench-8b $bench/bench $B8 --batch 1,8,16 --modes torch+graph,$MK --steps 50
    ;;
271) # session 27's final commit (~9.7 min): warm-ups of the Llama-3.2-1B and Llama-3.1-8B tables (graph / eager /
    # pdl-triton with qkv_rope's units per tile) beside 1,000 replays of graph / pdl / megakernel with the forced timeout
    # and the GPU tests of the tensor-core qkv_rope and of pdl's choice; then both tables
    mkdir -p "$W/bench" /tmp/warm
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    MK="graph,pdl,pdl-triton,megakernel" MT="torch+graph,torch+compile"
    log "warm-up"
    WARM_S=200 warm 1b $B1 --batch 1,2,4,8,16 --modes $MK
    WARM_S=200 warm 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    WARM_S=200 warm 8b $B8 --batch 1,8 --modes $MK
    WARM_S=200 warm 8b-16 $B8 --batch 16 --modes $MK
    (timeout 200 python3 scripts/replay_check.py --out "$W/replays-1b.json" >"$W/replays-1b.log" 2>&1) &
    (timeout 200 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_mma_gpu.py tests/test_stream_gpu.py \
        -k "qkv or pdl or auto" -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) &
    (timeout 200 python3 scripts/qkv_probe.py --warm >"$W/warm-probe.log" 2>&1) &
    wait
    checked 4
    tail -n 4 "$W/replays-1b.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    step 190 bench-1b $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50
    step 120 bench-8b $bench/bench $B8 --batch 1,8,16 --modes torch+graph,$MK --steps 50
    # where qkv_rope's time goes (scripts/qkv_probe.py: the op against itself without RoPE, without RMSNorm, without
    # both, and gate_up of the same weight bytes), batch 1
    step 50 probe-1 python3 scripts/qkv_probe.py --out "$W/qkv-probe-1.json"
    ;;
275) # session 27's final kernels (~8 min): qkv_rope back to 256-column chunks on Llama-3.2-1B (271's 512 columns were
    # 5% slower at batch 8 in graph mode); the Llama-3.2-1B table again (8B's kernels are 271's) beside the GPU tests of
    # pdl's choice and `auto` (271's ran out of GPU memory) and of the tensor-core qkv_rope
    mkdir -p "$W/bench" /tmp/warm
    B1="--model llama-3.2-1b --random-weights"
    MK="graph,pdl,pdl-triton,megakernel" MT="torch+graph,torch+compile"
    WARM_S=200 warm 1b $B1 --batch 1,2,4,8,16 --modes $MK
    WARM_S=200 warm 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    (timeout 200 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_mma_gpu.py tests/test_stream_gpu.py \
        -k "qkv or pdl or auto" -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 2
    step 200 bench-1b $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50
    ;;
274) # after 271 (~6.5 min): the GPU tests of pdl's choice and `auto` again (271's ran out of GPU memory beside two 8B
    # warm-ups), beside the warm-ups of the other three tables on the same kernels (qkv_rope's kernel changed for every
    # model): Qwen3-8B, SmolLM2-135M and Qwen3-0.6B (random weights); then the three tables
    mkdir -p /tmp/warm "$W/bench"
    Q8="--model qwen3-8b --random-weights --batch 1,8 --modes torch+graph,graph,pdl,pdl-triton,megakernel"
    B0="--model smollm2-135m --random-weights --batch 1,2,4,8,16 --modes torch+graph,graph,pdl,megakernel,megakernel-triton"
    Q0="--model qwen3-0.6b --random-weights --batch 1,2,4,8,16 --modes torch+graph,graph,pdl,megakernel"
    WARM_S=150 warm q8 $Q8
    WARM_S=150 warm smol $B0
    WARM_S=150 warm q0 $Q0
    (timeout 150 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "pdl or auto" \
        -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 3
    step 90 bench-qwen3-8b $bench/bench $Q8 --steps 50
    step 70 bench-smol $bench/bench $B0 --steps 50
    step 70 bench-qwen3-0.6b $bench/bench $Q0 --steps 50
    ;;
211) # the final commit (sessions 21, 22), one H200 (~6 min; carry .model/smolgz3.00, parked for 213): warm-ups of every
    # table's compiles beside the streaming GPU tests (mma + auto) and the 1B megakernel's bitwise invariance; then the
    # Llama-3.2-1B table (every mode, batch 1-16) and the Llama-3.1-8B table (graph, pdl, megakernel, torch+graph)
    cp .model/smolgz3.00 /tmp/model/ 2>/dev/null
    mkdir -p "$W/bench" /tmp/warm
    B0="--model smollm2-135m --random-weights" B1="--model llama-3.2-1b --random-weights"
    B8="--model llama-3.1-8b --random-weights"
    MK="graph,pdl,megakernel" MT="torch+graph,torch+compile"
    log "warm-up and checks"
    warm smol $B0 --batch 1,2,4,8,16 --modes torch+graph,$MK,megakernel-triton
    warm 1b $B1 --batch 1,2,4,8,16 --modes $MK
    warm 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    warm 8b $B8 --batch 1,8,16 --modes $MK,torch+graph
    checks 220
    wait
    checked 4
    step 190 bench-1b $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50
    step 100 bench-8b $bench/bench $B8 --batch 1,8,16 --modes torch+graph,$MK --steps 50
    ;;
212) # at once after 211 (warm machine, caches warm; carry .model/smolgz3.01; ~6.5 min): 1,000 replays and the
    # forced timeouts (SmolLM2-135M, then Llama-3.2-1B) beside the cold / warm start of six cases (fresh processes, two
    # at a time: at most two 8B processes); then the SmolLM2-135M table alone; the Llama-3.2-1B profiles at batch 1
    # and 8 with their PNGs
    cp .model/smolgz3.01 /tmp/model/ && log "parked: $(ls /tmp/model)"
    mkdir -p "$W/bench"
    B0="--model smollm2-135m --random-weights"
    MK="graph,pdl,megakernel"
    CT="llama-3.2-1b:1:megakernel,llama-3.2-1b:16:megakernel,llama-3.1-8b:1:megakernel,llama-3.1-8b:16:megakernel"
    CT="$CT,llama-3.2-1b:16:graph,llama-3.1-8b:16:graph"
    (step 75 replays-smol python3 scripts/replay_check.py --model smollm2-135m --out "$W/replays-smol.json";
     step 75 replays-1b python3 scripts/replay_check.py --out "$W/replays-1b.json") &
    (step 200 compile-times python3 scripts/compile_times.py --out "$W" --jobs 2 --timeout 60 --cases "$CT") &
    wait
    step 75 bench-smol $bench/bench $B0 --batch 1,2,4,8,16 --modes torch+graph,$MK,megakernel-triton --steps 50
    step 60 profile-1b-1 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    step 60 profile-1b-8 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 8
    step 60 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
213) # at once after 212 (carry .model/smolgz3.02; ~3 min): the default GGUF joined; its greedy tokens (5 prompts alone
    # and together, every mode and the reference), then its table at batch 1 and 8
    cat /tmp/model/smolgz3.00 /tmp/model/smolgz3.01 .model/smolgz3.02 | gunzip >"$GGUF" \
        && log "model joined: $(stat -c %s "$GGUF") bytes"
    mkdir -p "$W/bench-real"
    MK="graph,pdl,megakernel"
    step 150 greedy-real python3 scripts/greedy_tokens.py "$GGUF" "$W/greedy-real.json"
    step 50 bench-135m $bench/bench-real --model "$GGUF" --batch 1,8 --modes torch+graph,$MK --steps 50
    ;;
243) # session 24 (~8 min): the Llama-3.1-8B table again (call 242's batch-16 row shared the GPU with 212's processes:
    # an outer time limit ended 211's shell, not its bench), and Qwen3-8B at batch 1 / 8 with torch+graph and
    # torch.compile; warm-ups beside Qwen3's GPU tests
    mkdir -p /tmp/warm "$W/bench"
    B8="--model llama-3.1-8b --random-weights --batch 1,8,16 --modes torch+graph,graph,pdl,megakernel"
    Q8="--model qwen3-8b --random-weights --batch 1,8 --modes torch+graph,torch+compile,graph,pdl,megakernel"
    WARM_S=200 warm 8b $B8
    WARM_S=200 warm q8 $Q8
    (timeout 220 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k qwen3 -p no:cacheprovider -rfE \
        >"$W/gpu-tests.log" 2>&1) &
    wait
    checked 2
    step 110 bench-8b $bench/bench $B8 --steps 50
    step 150 bench-qwen3-8b $bench/bench $Q8 --steps 50
    ;;
244) # session 24 (~4 min): Qwen3-0.6B on the final kernels (batch 5-16 changed): its table (batch 1-16, every Triton
    # mode and torch+graph) after a warm-up beside its 1,000 replays and forced timeout
    mkdir -p /tmp/warm "$W/bench"
    Q0="--model qwen3-0.6b --random-weights --batch 1,2,4,8,16 --modes torch+graph,graph,pdl,megakernel"
    WARM_S=150 warm q0 $Q0
    (step 150 replays-qwen3 python3 scripts/replay_check.py --model qwen3-0.6b --out "$W/replays-qwen3.json") &
    wait
    checked 1
    step 70 bench-qwen3-0.6b $bench/bench $Q0 --steps 50
    ;;
235) # prepared in session 23 (~7 min; session 24 ran its Qwen3-8B part as 243): Qwen3 on the final commit: its GPU tests
    # and 1,000 replays + the forced timeout on Qwen3-0.6B beside the warm-ups, then the Qwen3-8B table with its
    # baselines (torch+graph, torch.compile; batch 1 / 8) and Qwen3-0.6B's (batch 1-16)
    mkdir -p /tmp/warm "$W/bench"
    Q0="--model qwen3-0.6b --random-weights --batch 1,2,4,8,16 --modes torch+graph,graph,pdl,megakernel"
    Q8="--model qwen3-8b --random-weights --batch 1,8 --modes torch+graph,torch+compile,graph,pdl,megakernel"
    WARM_S=240 warm q0 $Q0
    WARM_S=240 warm q8 $Q8
    (timeout 300 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k qwen3 -p no:cacheprovider -rfE \
        >"$W/gpu-tests.log" 2>&1) &
    (step 150 replays-qwen3 python3 scripts/replay_check.py --model qwen3-0.6b --out "$W/replays-qwen3.json") &
    wait
    checked 2
    step 60 bench-qwen3-0.6b $bench/bench $Q0 --steps 50
    step 120 bench-qwen3-8b $bench/bench $Q8 --steps 50
    ;;
223) # session 22 (~3 min): the streaming kernel's CUDA-core GPU tests (-k fma: SmolLM2-135M and Llama-3.2-1B at batch
    # 3, Llama-3.2-1B at 16, whose activation buffer outgrew the ring at f6c1f4d; against the reference, the Triton
    # megakernel and each row's batch-1 run)
    step 400 gpu-tests-fma env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k fma \
        -p no:cacheprovider -rfE
    ;;
222) # session 22 (~1 min): how long one stage hands its activation to the next (scripts/signal_probe.py: a ping-pong
    # of 4 KB and 32 KB messages between two CTAs, counter + acquire poll against NCCL's LL flags in the data; idle and
    # with the other SMs streaming HBM)
    step 60 probe-4k python3 scripts/signal_probe.py --words 512 --out "$W/signal-probe-4k.json"
    step 60 probe-32k python3 scripts/signal_probe.py --words 4096 --out "$W/signal-probe-32k.json"
    ;;
210) # session 21 (208 s; prepared in session 20): one event per producer op (STREAM_OP_EVENTS=1:
    # an attention task spins on one counter instead of 1-5) against tile events, the same kernels, each its own
    # process; beside the warm-ups a bitwise A/B of one step (logits_dump.py, Llama-3.2-1B batch 8: the events order
    # the tasks, never their values); then the timings, the forced timeout and the 1B batch-1 profile with it. At
    # most two 8B processes (~49 GB each) at once: the GPU's 139 GB ran out with 12 processes in call 200
    mkdir -p /tmp/warm
    S1="--model llama-3.2-1b --random-weights --modes megakernel --batch 1,8,16"
    S8="--model llama-3.1-8b --random-weights --modes megakernel --batch 1,8,16"
    S0="--model smollm2-135m --random-weights --modes megakernel --batch 1,8"
    wtree 220 tile1 . STREAM_OP_EVENTS=0 $S1; wtree 220 op1 . STREAM_OP_EVENTS=1 $S1
    wtree 220 tile8 . STREAM_OP_EVENTS=0 $S8; wtree 220 op8 . STREAM_OP_EVENTS=1 $S8
    wtree 220 tile0 . STREAM_OP_EVENTS=0 $S0; wtree 220 op0 . STREAM_OP_EVENTS=1 $S0
    (timeout 120 env STREAM_OP_EVENTS=0 python3 scripts/logits_dump.py "$W/tile-1b.pt" >"$W/dump-tile.log" 2>&1
     timeout 100 env STREAM_OP_EVENTS=1 python3 scripts/logits_dump.py "$W/op-1b.pt" >"$W/dump-op.log" 2>&1) &
    wait
    checked 6
    python3 scripts/logits_dump.py --compare "$W/tile-1b.pt" "$W/op-1b.pt" 2>&1 | tail -2 | tee -a "$OUT/log.txt"
    rm -f "$W"/*.pt
    ttree 35 tile-1b . STREAM_OP_EVENTS=0 $S1
    ttree 35 op-1b . STREAM_OP_EVENTS=1 $S1
    ttree 45 tile-8b . STREAM_OP_EVENTS=0 $S8
    ttree 45 op-8b . STREAM_OP_EVENTS=1 $S8
    ttree 20 tile-smol . STREAM_OP_EVENTS=0 $S0
    ttree 20 op-smol . STREAM_OP_EVENTS=1 $S0
    ttree 35 tile2-1b . STREAM_OP_EVENTS=0 $S1
    step 60 timeouts env STREAM_OP_EVENTS=1 python3 scripts/replay_check.py --model smollm2-135m --replays 10 \
        --out "$W/replays-op-smol.json"
    step 60 profile-1b-1 env STREAM_OP_EVENTS=1 python3 scripts/stream_profile.py --out "$W/profile-op" \
        --model llama-3.2-1b --batch 1
    ;;
195) # session 19 (~3.5 min; .base.tgz = `git archive a88ee12 onekernel | gzip`, run 18's kernels, untracked so it
    # travels): Llama-3.1-8B megakernel at batch 1 and 8 with this tree's kernels (call 192: 4.574 ms at batch 8) against
    # a88ee12's (run 18: 4.784 and 4.773), each its own process, warmed in parallel, timed one after the other
    mkdir -p /tmp/base /tmp/warm && tar -xzf .base.tgz -C /tmp/base
    B8="--model llama-3.1-8b --random-weights --modes megakernel --batch 1,8"
    wtree 150 head8 . X=0 $B8; wtree 150 base8 /tmp/base X=0 $B8
    wait
    checked 2
    ttree 35 head-8b . X=0 $B8
    ttree 35 base-8b /tmp/base X=0 $B8
    ;;
194) # session 19 (~2 min): the streaming GPU tests 191 ran out of time for: "auto" (Llama-3.2-1B's tensor-core step, and
    # SmolLM2-135M's megakernel with no GEMV path asked for: runtime.runners.megakernel_step) at batch 1 and 16
    step 200 gpu-tests-auto env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k auto \
        -p no:cacheprovider -rfE
    ;;
193) # session 19 (~4 min): SmolLM2-135M's streaming megakernel: the forced timeout's message (EventTable.stall_origin)
    # and its cold / warm start (compile_times.py, 2 at a time), beside the warm-ups of the Llama-3.2-1B megakernel with
    # the tensor-core attention's copies issued after P V (STREAM_ATTN_LATE=1) and without; then both timed, base twice
    mkdir -p /tmp/warm
    B1="--model llama-3.2-1b --random-weights --modes megakernel --batch 1,8,16"
    wtree 200 late . STREAM_ATTN_LATE=1 $B1; wtree 200 base . X=0 $B1
    (step 60 timeout-smol python3 scripts/replay_check.py --model smollm2-135m --replays 10 \
        --out "$W/replays-smol.json") &
    (step 170 compile-times python3 scripts/compile_times.py --out "$W" --jobs 2 --timeout 75 \
        --cases "smollm2-135m:1:megakernel,smollm2-135m:16:megakernel") &
    wait
    checked 2
    ttree 40 base-1b . X=0 $B1
    ttree 40 late-1b . STREAM_ATTN_LATE=1 $B1
    ttree 40 base2-1b . X=0 $B1
    ;;
190) # session 19 (~5 min): SmolLM2-135M (the default model's shapes, random weights) on both GEMV paths: graph, pdl,
    # the Triton megakernel ("auto" keeps it: stream_support.prefer_stream), the streaming megakernel (megakernel-gluon)
    # and pdl on its bodies, batch 1 / 8 / 16, one process per GEMV path; torch.compile beside the fma row; then the
    # streaming kernel's batch-1 profiles on both paths
    mkdir -p "$W/profile" /tmp/warm
    S="--model smollm2-135m --random-weights --batch 1,8,16"
    wtree 230 fma . X=0 $S --gemv fma --modes torch+compile,graph,pdl,megakernel,megakernel-gluon,pdl-gluon
    wtree 230 mma . X=0 $S --gemv mma --modes graph,pdl,megakernel,megakernel-gluon,pdl-gluon
    (timeout 230 python3 scripts/stream_profile.py --out /tmp/warm/pf --model smollm2-135m --gemv fma >/dev/null 2>&1) &
    (timeout 230 python3 scripts/stream_profile.py --out /tmp/warm/pm --model smollm2-135m --gemv mma >/dev/null 2>&1) &
    wait
    checked 2
    ttree 60 smol-fma . X=0 $S --gemv fma --modes torch+compile,graph,pdl,megakernel,megakernel-gluon,pdl-gluon
    ttree 50 smol-mma . X=0 $S --gemv mma --modes graph,pdl,megakernel,megakernel-gluon,pdl-gluon
    step 40 profile-smol-fma python3 scripts/stream_profile.py --out "$W/profile/fma" --model smollm2-135m --gemv fma
    step 40 profile-smol-mma python3 scripts/stream_profile.py --out "$W/profile/mma" --model smollm2-135m --gemv mma
    ;;
185) # session 18, branch s18-attn-stamps (~2 min): where a tensor-core attention block's time goes (profile-only
    # stamps: the copy waits, a wait's end to P): Llama-3.2-1B batch 16, Llama-3.1-8B batch 8 (its regression)
    mkdir -p "$W/profile"
    step 40 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    step 65 profile-8b-8 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.1-8b --batch 8
    ;;
183) # after 182 (~5 min): Llama-3.1-8B megakernel at batch 1 / 8 with the tensor-core attention (the default) and
    # without it (STREAM_ATTN_TC=0: "base"), each its own process (182's table had 8B batch 8 at 4.784 ms against run
    # 16's 4.572, and calls 180-181 measured only batch 1 and 16); then the per-op GEMV table (gpu_suite ops: bandwidth
    # against the copy measured in the same run) and the Llama-3.2-1B batch-1 megakernel profile (the step's PNG)
    mkdir -p "$W/profile" /tmp/warm
    B8="--model llama-3.1-8b --random-weights --modes megakernel --batch 1,8"
    wtree 200 tc8 . X=0 $B8; wtree 200 base8 . STREAM_ATTN_TC=0 $B8
    wait
    checked 2
    ttree 40 tc-8b . X=0 $B8
    ttree 40 base-8b . STREAM_ATTN_TC=0 $B8
    step 90 ops $suite ops
    [ -f "$W/results.json" ] && mv "$W/results.json" "$W/ops.json"
    step 60 profile-1b-1 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    ;;
181) # session 18, branch s18-attn-tc after 180 (~6 min): the tensor-core attention with its run's K/V prefetched into
    # L2 before the dependency wait and q reused across a group's tiles (the default), without the prefetch
    # (STREAM_ATTN_L2=0: "nol2") and the CUDA-core attention (STREAM_ATTN_TC=0: "base"), each its own process:
    # Llama-3.2-1B megakernel at 1 / 8 / 16, Llama-3.1-8B at 1 / 16 (tc and base); the 1B and 8B batch-16 profiles;
    # bitwise invariance and the streaming GPU tests (Llama, mma) beside the warm-ups (at most two 8B processes)
    mkdir -p /tmp/warm "$W/profile"
    B1="--model llama-3.2-1b --random-weights --modes megakernel --batch 1,8,16"
    B8="--model llama-3.1-8b --random-weights --modes megakernel --batch 1,16"
    log "warm-up and checks"
    wtree 220 tc1 . X=0 $B1; wtree 220 nol21 . STREAM_ATTN_L2=0 $B1; wtree 220 base1 . STREAM_ATTN_TC=0 $B1
    wtree 220 tc8 . X=0 $B8; wtree 220 base8 . STREAM_ATTN_TC=0 $B8
    checks 240 "llama and mma"
    wait
    checked 5
    ttree 30 tc-1b . X=0 $B1
    ttree 30 nol2-1b . STREAM_ATTN_L2=0 $B1
    ttree 30 base-1b . STREAM_ATTN_TC=0 $B1
    ttree 60 tc-8b . X=0 $B8
    ttree 60 base-8b . STREAM_ATTN_TC=0 $B8
    step 45 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    step 60 profile-8b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.1-8b --batch 16
    ;;
180) # session 18, branch s18-attn-tc (~7 min): attention on the tensor cores with the warps splitting the positions
    # (stream_attn_tc, the default where it fits; STREAM_ATTN_TC=0 keeps the CUDA-core attention: "base"), each its own
    # process, warmed in parallel with the streaming GPU tests and the 1B megakernel's bitwise invariance at 2/8/16;
    # Llama-3.2-1B megakernel at 1 / 8 / 16 and Llama-3.1-8B at 1 / 16; then the 1B batch-16 and 8B batch-16 profiles
    mkdir -p /tmp/warm "$W/profile"
    B1="--model llama-3.2-1b --random-weights --modes megakernel --batch 1,8,16"
    B8="--model llama-3.1-8b --random-weights --modes megakernel --batch 1,16"
    log "warm-up and checks"
    wtree 220 tc1 . X=0 $B1; wtree 220 base1 . STREAM_ATTN_TC=0 $B1
    wtree 220 tc8 . X=0 $B8; wtree 220 base8 . STREAM_ATTN_TC=0 $B8
    checks 240
    wait
    checked 4
    ttree 30 tc-1b . X=0 $B1
    ttree 30 base-1b . STREAM_ATTN_TC=0 $B1
    ttree 60 tc-8b . X=0 $B8
    ttree 60 base-8b . STREAM_ATTN_TC=0 $B8
    step 45 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    step 60 profile-8b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.1-8b --batch 16
    ;;
174) # session 17, branch s17-attn-ring (~2 min): the tensor-core attention with a 4-deep K/V ring (3 chunks in
    # flight) and the run's K/V rows prefetched into L2 at the task's start, against the CUDA-core attention
    # (STREAM_ATTN_MMA=0) in the same call, each its own process: Llama-3.2-1B megakernel at 1 / 8 / 16
    mkdir -p /tmp/warm
    B1="--model llama-3.2-1b --random-weights --modes megakernel --batch 1,8,16"
    log "warm-up"
    wtree 90 base . STREAM_ATTN_MMA=0 $B1; wtree 90 ring . X=0 $B1
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 2 benches finished"
    ttree 20 ring-1b . X=0 $B1
    ttree 20 base-1b . STREAM_ATTN_MMA=0 $B1
    ;;
173) # session 17's final commit, one H200 (~9.5 min): attention on the tensor cores (stream_attn_mma, the default;
    # STREAM_ATTN_MMA=0 keeps the CUDA-core attention: "base"). Compiles warmed in parallel with the streaming GPU tests
    # (mma + auto) and bitwise invariance at 2/8/16; then the Llama-3.2-1B table (every mode, batch 1-16), the base's
    # 1B megakernel rows, the Llama-3.1-8B rows (graph, pdl, megakernel, torch+graph at 1 / 8 / 16; torch.compile not
    # re-run), the 1B batch-16 profile
    mkdir -p "$W/bench" "$W/profile" /tmp/warm
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    MK="graph,pdl,megakernel" MT="torch+graph,torch+compile"
    log "warm-up and checks"
    warm 1b $B1 --batch 1,2,4,8,16 --modes $MK
    warm 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    warm 8b $B8 --batch 1,8,16 --modes $MK,torch+graph
    wtree 220 base . STREAM_ATTN_MMA=0 $B1 --modes megakernel --batch 1,8,16
    checks 220
    wait
    checked 4
    step 130 bench-1b $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50
    ttree 30 base-1b . STREAM_ATTN_MMA=0 $B1 --modes megakernel --batch 1,8,16
    step 150 bench-8b $bench/bench $B8 --batch 1,8,16 --modes torch+graph,$MK --steps 50
    step 45 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
172) # session 17 (~5 min): pdl on the Gluon bodies (pdl-gluon) beside pdl, graph and the megakernel at main, one
    # process per model (Llama-3.2-1B batch 1 / 8 / 16, Llama-3.1-8B batch 1 / 16): should "pdl" take the Gluon
    # segments for a model that prefers streaming, as "megakernel" does? Compiles warmed in parallel first
    mkdir -p /tmp/warm
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    log "warm-up"
    for b in 1 8 16; do wtree 220 pg-1b-$b . X=0 $B1 --modes pdl-gluon --batch $b; done
    wtree 220 rest-1b . X=0 $B1 --modes graph,pdl,megakernel --batch 1,8,16
    wtree 220 pg-8b . X=0 $B8 --modes pdl-gluon --batch 1,16
    wtree 220 rest-8b . X=0 $B8 --modes graph,pdl,megakernel --batch 1,16
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 6 benches finished"
    ttree 60 modes-1b . X=0 $B1 --modes graph,pdl,pdl-gluon,megakernel --batch 1,8,16
    ttree 90 modes-8b . X=0 $B8 --modes graph,pdl,pdl-gluon,megakernel --batch 1,16
    ;;
171) # session 17 (~8.5 min): the tensor-core GEMV's chain sums deferred past the next chunk's MMAs (STREAM_MMA_DEFER=1)
    # and the loader's L2 prefetch while its ring is full (STREAM_L2_STALL=8 / 16 chunks), each variant its own process
    # against the defaults (both off) in the same call: Llama-3.2-1B megakernel at batch 1 / 8 / 16, Llama-3.1-8B base
    # and both at 1 / 16; the logits of every variant bitwise against the base's (batch 8); invariance with both on
    mkdir -p "$W/profile" "$W/bits" /tmp/warm
    B1="--model llama-3.2-1b --random-weights --modes megakernel --batch 1,8,16"
    B8="--model llama-3.1-8b --random-weights --modes megakernel --batch 1,16"
    BOTH="STREAM_MMA_DEFER=1 STREAM_L2_STALL=8"
    log "warm-up and checks"
    wtree 200 base . X=0 $B1; wtree 200 defer . STREAM_MMA_DEFER=1 $B1; wtree 200 l2s8 . STREAM_L2_STALL=8 $B1
    wtree 200 both . "$BOTH" $B1; wtree 200 l2s16 . STREAM_L2_STALL=16 $B1
    wtree 200 base-8b . X=0 $B8; wtree 200 both-8b . "$BOTH" $B8
    (timeout 200 env $BOTH python3 scripts/invariance_check.py llama-3.2-1b --modes megakernel --out "$W/inv-1b.json" \
        >"$W/inv-1b.log" 2>&1) &
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 7 benches finished"
    grep -h '"mode"' "$W"/inv-*.log | cut -c1-200 | tee -a "$OUT/log.txt"
    for v in base:X=0 defer:STREAM_MMA_DEFER=1 l2s8:STREAM_L2_STALL=8 both:"$BOTH"; do
        (timeout 90 env ${v#*:} python3 scripts/logits_dump.py "$W/bits/${v%%:*}.pt" >"$W/bits/${v%%:*}.log" 2>&1) &
    done
    wait
    for v in defer l2s8 both; do
        python3 scripts/logits_dump.py --compare "$W/bits/base.pt" "$W/bits/$v.pt" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
    done
    ttree 30 base-1b . X=0 $B1
    ttree 30 defer-1b . STREAM_MMA_DEFER=1 $B1
    ttree 30 l2s8-1b . STREAM_L2_STALL=8 $B1
    ttree 30 both-1b . "$BOTH" $B1
    ttree 30 l2s16-1b . STREAM_L2_STALL=16 $B1
    ttree 30 base2-1b . X=0 $B1
    ttree 30 both2-1b . "$BOTH" $B1
    ttree 45 base-8b . X=0 $B8
    ttree 45 both-8b . "$BOTH" $B8
    step 25 profile-both-1 env $BOTH python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    ;;
170) # session 17's first call (~4.5 min): where the time goes. The attention sub-stamps' first run: streaming profiles of
    # Llama-3.2-1B at batch 1 / 8 / 16 and Llama-3.1-8B at 1 / 16 (compiled in parallel first, then timed one at a
    # time); the packed RMSNorm rounding test; the Llama-3.1-8B batch-1 warm start under cProfile (issue 12: 5.1 s)
    mkdir -p "$W/profile" /tmp/warm
    P="python3 scripts/stream_profile.py"
    log "warm-up and checks"
    for mb in llama-3.2-1b:1 llama-3.2-1b:8 llama-3.2-1b:16 llama-3.1-8b:1 llama-3.1-8b:16; do
        (timeout 150 $P --out /tmp/warm --model ${mb%:*} --batch ${mb#*:} >"$W/warm-${mb/:/-}.log" 2>&1) &
    done
    (timeout 150 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k norm_bf16 \
        -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) &
    wait
    tail -n 3 "$W/gpu-tests.log" | tee -a "$OUT/log.txt"
    for mb in llama-3.2-1b:1 llama-3.2-1b:8 llama-3.2-1b:16 llama-3.1-8b:1 llama-3.1-8b:16; do
        step 40 "profile-${mb/:/-}" $P --out "$W/profile" --model "${mb%:*}" --batch "${mb#*:}"
    done
    step 60 start-8b python3 scripts/compile_times.py --child llama-3.1-8b 1 megakernel
    step 60 start-8b-cprofile bash -c "python3 -m cProfile -s cumtime scripts/compile_times.py --child llama-3.1-8b 1 \
        megakernel | head -90"
    ;;
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
131) # session 13, branch s13-layer (~4 min): pdl on the Gluon bodies cut per layer (pdl-gluon-layer) beside per op
    # (pdl-gluon), pdl and the megakernel, batch 1, one process per model after a parallel warm-up (the kernels of
    # the two cuts are the same three; only their ranges differ)
    B1="--model llama-3.2-1b --random-weights --batch 1" B8="--model llama-3.1-8b --random-weights --batch 1"
    M="pdl,megakernel,pdl-gluon,pdl-gluon-layer"
    mkdir -p "$W/bench" /tmp/warm
    log "warm-up"
    (timeout 150 python3 -m onekernel.cli bench --steps 2 --modes $M --out /tmp/warm/1b $B1 >"$W/warm-1b.log" 2>&1) &
    (timeout 150 python3 -m onekernel.cli bench --steps 2 --modes $M --out /tmp/warm/8b $B8 >"$W/warm-8b.log" 2>&1) &
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 2 benches finished"
    step 30 bench-1b $bench/bench $B1 --modes $M --steps 50
    step 45 bench-8b $bench/bench $B8 --modes $M --steps 50
    ;;
162) # after 160 + 161 (~4 min): the streaming kernel's GPU tests at the final commit, then the Llama-3.1-8B cells 160
    # did not reach: torch+graph at batch 1, 8, 16 (one process; torch.compile at 16 stays unmeasured)
    mkdir -p "$W/bench"
    step 200 gpu-tests env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "mma or auto or rnd" \
        -p no:cacheprovider -rfE
    step 150 bench-8b-t $bench/bench --model llama-3.1-8b --random-weights --batch 1,8,16 --modes torch+graph \
        --steps 50
    ;;
160) # session 16's final commit, one H200 (~8 min; carry .model/smol.p1, parked for 161). Compiles warmed in parallel
    # with the GPU tests (the packed RMSNorm rounding first) and bitwise invariance at 2/8/16 in every mode; then the
    # Llama-3.2-1B table (every mode, batch 1-16) and the Llama-3.1-8B table (batch 1, 8, 16; torch+graph not re-run)
    cp .model/smol.p1 /tmp/model/ 2>/dev/null
    WARM_S=185
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    MK="graph,pdl,megakernel" MT="torch+graph,torch+compile"
    mkdir -p "$W/bench" /tmp/warm
    log "warm-up and checks"
    warm 1b $B1 --batch 1,2,4,8,16 --modes $MK
    warm 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    warm 8b $B8 --batch 1,8,16 --modes $MK
    (timeout 185 python3 scripts/invariance_check.py llama-3.2-1b --modes eager,graph,pdl,megakernel \
        --out "$W/inv-1b.json" >"$W/inv-1b.log" 2>&1) &
    (timeout 185 env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k rnd -p no:cacheprovider -rfE \
        >"$W/gpu-tests-rnd.log" 2>&1) &
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 3 benches finished"
    tail -n 2 "$W/gpu-tests-rnd.log" | tee -a "$OUT/log.txt"
    grep -h '"mode"' "$W"/inv-1b.log | cut -c1-200 | tee -a "$OUT/log.txt"
    step 130 bench-1b $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50
    step 170 bench-8b $bench/bench $B8 --batch 1,8,16 --modes torch+compile,$MK --steps 50
    ;;
161) # at once after 160 (warm machine; carry .model/smol.p2): the real default model (5 prompts alone and together,
    # every mode) beside the cold / warm start times, then 1,000 replays and the forced timeout; the SmolLM2-135M
    # table; the Llama-3.2-1B profiles (batch 1 and 16). ~5.5 min
    cat /tmp/model/smol.p1 .model/smol.p2 >"$GGUF" && log "model joined: $(stat -c %s "$GGUF") bytes"
    mkdir -p "$W/bench" "$W/profile"
    # the Llama-3.1-8B batch-16 rows 160 did not reach (torch.compile compiled them inside its timed step)
    step 60 bench-8b-16 $bench/bench --model llama-3.1-8b --random-weights --batch 16 --modes graph,pdl,megakernel \
        --steps 50
    CT="llama-3.2-1b:1:megakernel,llama-3.2-1b:16:megakernel,llama-3.1-8b:1:megakernel,llama-3.1-8b:16:megakernel"
    CT="$CT,llama-3.2-1b:16:graph,llama-3.1-8b:16:graph"
    (step 150 compile-times python3 scripts/compile_times.py --out "$W" --jobs 3 --timeout 60 --cases "$CT") &
    (step 130 greedy-real python3 scripts/greedy_tokens.py "$GGUF" "$W/greedy-real.json";
     step 70 replays python3 scripts/replay_check.py --out "$W/replays.json") &
    wait
    step 50 bench-135m $bench/bench --model "$GGUF" --batch 1,8 --modes torch+graph,graph,pdl,megakernel --steps 50
    step 25 profile-1b python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b
    step 25 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
151) # session 16 (~4 min): the tensor-core GEMV's gate_up and LM-head epilogues unrolled over the block's units and
    # masked (this tree) against the commit before (.base.tgz, unpacked to /tmp/base), each its own process; the GPU
    # tests (the RMSNorm rounding by the packed conversions included) and invariance of this tree beside the warm-ups
    mkdir -p /tmp/base /tmp/warm "$W/profile" && tar -xzf .base.tgz -C /tmp/base
    log "base tree: $(cat /tmp/base/COMMIT)"
    BC="ONEKERNEL_COMMIT=$(cat /tmp/base/COMMIT)"
    B1="--model llama-3.2-1b --random-weights --modes megakernel --batch 1,8,16"
    log "warm-up and checks"
    wtree 170 new . X=0 $B1; wtree 170 base /tmp/base "$BC" $B1
    checks 170 "mma or auto or rnd"
    wait
    checked
    ttree 30 base-1b /tmp/base "$BC" $B1
    ttree 30 new-1b . X=0 $B1
    ttree 30 base2-1b /tmp/base "$BC" $B1
    ttree 30 new2-1b . X=0 $B1
    step 20 profile-new-1 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    step 20 profile-new-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
150) # session 16 (~6 min): attention's dead tiles skipped (default; STREAM_ATTN_SKIP=0 computes them) and its K/V ring
    # (default above batch 8; STREAM_ATTN_KV=0 off; STREAM_ATTN_KV_MIN_B=2 also at batch 2-8, 2 ring slots fewer);
    # base = both off (run 14's kernels); and, if .gb.tgz was carried, the tree in it (branch s16-gb on this commit:
    # bigger MMA blocks, cheaper staging) unpacked to /tmp/gb. Each variant its own process (a tree's process runs
    # from its directory). GPU tests and invariance beside the warm-ups; then the Llama-3.2-1B megakernel rows one
    # process at a time, the profiles (Llama-3.1-8B: in the final call, base beside default)
    [ -f .gb.tgz ] && mkdir -p /tmp/gb && tar -xzf .gb.tgz -C /tmp/gb && log "gb tree: $(cat /tmp/gb/COMMIT)"
    GBC="ONEKERNEL_COMMIT=$(cat /tmp/gb/COMMIT 2>/dev/null)" OFF="STREAM_ATTN_KV=0 STREAM_ATTN_SKIP=0"
    mkdir -p "$W/profile" /tmp/warm
    B1="--model llama-3.2-1b --random-weights --modes megakernel"
    log "warm-up and checks"
    wtree 200 base . "$OFF" $B1 --batch 1,8,16; wtree 200 new . X=0 $B1 --batch 1,8,16
    wtree 200 kvonly . STREAM_ATTN_SKIP=0 $B1 --batch 16
    wtree 200 kv8 . STREAM_ATTN_KV_MIN_B=2 $B1 --batch 8; wtree 200 gb /tmp/gb "$GBC" $B1 --batch 1,8,16
    checks 200
    (timeout 200 env STREAM_ATTN_KV_MIN_B=2 python3 scripts/invariance_check.py llama-3.2-1b --modes megakernel \
        --batches 3,8,12 --out "$W/inv-kv8.json" >"$W/inv-kv8.log" 2>&1) &
    wait
    checked
    ttree 30 base-1b . "$OFF" $B1 --batch 1,8,16
    ttree 30 new-1b . X=0 $B1 --batch 1,8,16
    ttree 20 kvonly-1b . STREAM_ATTN_SKIP=0 $B1 --batch 16
    ttree 20 kv8-1b . STREAM_ATTN_KV_MIN_B=2 $B1 --batch 8
    ttree 30 gb-1b /tmp/gb "$GBC" $B1 --batch 1,8,16
    ttree 30 base2-1b . "$OFF" $B1 --batch 1,8,16
    step 20 profile-new-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    step 20 profile-new-1 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 1
    [ -d /tmp/gb/onekernel ] && step 20 profile-gb-16 bash -c "cd /tmp/gb && PYTHONPATH=/tmp/site:/tmp/gb python3 \
        scripts/stream_profile.py --out $W/profile/gb --model llama-3.2-1b --batch 16"
    ;;
142) # session 14, after call 110 at 5e91595 ran out of its steps' time before the batch-16 megakernel rows (~5 min):
    # those rows (1B, 8B, each its own process), 8B with merge tasks (STREAM_FOLD_MERGE=0) beside the folded one,
    # 1,000 replays, the folded batch-16 profile
    mkdir -p "$W/bench" "$W/sep" "$W/fold" "$W/profile" /tmp/warm
    M1="--model llama-3.2-1b --random-weights --modes megakernel" M8="--model llama-3.1-8b --random-weights --modes megakernel"
    wv() { local name=$1 envs=$2; shift 2; (timeout 170 env $envs python3 -m onekernel.cli bench --steps 2 \
           --out /tmp/warm/$name "$@" >"$W/warm-$name.log" 2>&1) & }
    log "warm-up and replays"
    wv mk1 X=0 $M1 --batch 16; wv mk8 X=0 $M8 --batch 1,8,16; wv sep8 STREAM_FOLD_MERGE=0 $M8 --batch 1,8
    (timeout 170 python3 scripts/replay_check.py --out "$W/replays.json" >"$W/replays.log" 2>&1) &
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 3 benches finished"
    tail -n 4 "$W/replays.log" | tee -a "$OUT/log.txt"
    step 25 mk16-1b $bench/bench $M1 --batch 16 --steps 50
    step 45 fold-8b $bench/fold $M8 --batch 1,8,16 --steps 50
    step 35 sep-8b env STREAM_FOLD_MERGE=0 $bench/sep $M8 --batch 1,8 --steps 50
    step 20 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
141) # session 14, branch s14-fold after call 140 (~3.5 min): the same A/B without the WAW chain (call 140's plan chained
    # each group's splits through their merged-row regions), Llama-3.2-1B megakernel only, then the folded profile
    B1="--model llama-3.2-1b --random-weights --batch 1,8,16 --modes megakernel"
    mkdir -p "$W/fold" "$W/sep" "$W/profile" /tmp/warm
    wv() { local name=$1 envs=$2; shift 2; (timeout 170 env $envs python3 -m onekernel.cli bench --steps 2 \
           --out /tmp/warm/$name "$@" >"$W/warm-$name.log" 2>&1) & }
    log "warm-up"
    wv fold1 X=0 $B1; wv sep1 STREAM_FOLD_MERGE=0 $B1
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 2 benches finished"
    step 25 fold-1b $bench/fold $B1 --steps 50
    step 25 sep-1b env STREAM_FOLD_MERGE=0 $bench/sep $B1 --steps 50
    step 25 fold-1b-2 $bench/fold $B1 --steps 50
    step 20 profile-1b python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b
    ;;
140) # session 14, branch s14-fold (~6 min): attention tasks merge the split-KV partials (the last split of a group,
    # stream_plan.FOLD; STREAM_FOLD_MERGE=0 keeps the merge tasks) against the merge tasks, each in its own process;
    # its GPU tests and bitwise invariance beside the warm-ups; profiles of the folded step (1B batch 1 and 16)
    B1="--model llama-3.2-1b --random-weights --batch 1,8,16" B8="--model llama-3.1-8b --random-weights --batch 1,8"
    mkdir -p "$W/fold" "$W/sep" "$W/profile" /tmp/warm
    wv() { local name=$1 envs=$2; shift 2; (timeout 200 env $envs python3 -m onekernel.cli bench --steps 2 \
           --out /tmp/warm/$name "$@" >"$W/warm-$name.log" 2>&1) & }
    log "warm-up and checks"
    wv fold1 X=0 $B1 --modes megakernel,pdl-gluon; wv sep1 STREAM_FOLD_MERGE=0 $B1 --modes megakernel,pdl-gluon
    wv fold8 X=0 $B8 --modes megakernel; wv sep8 STREAM_FOLD_MERGE=0 $B8 --modes megakernel
    checks 230
    wait
    checked 4
    step 30 fold-1b $bench/fold $B1 --modes megakernel,pdl-gluon --steps 50
    step 30 sep-1b env STREAM_FOLD_MERGE=0 $bench/sep $B1 --modes megakernel,pdl-gluon --steps 50
    step 40 fold-8b $bench/fold $B8 --modes megakernel --steps 50
    step 40 sep-8b env STREAM_FOLD_MERGE=0 $bench/sep $B8 --modes megakernel --steps 50
    step 25 profile-1b python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b
    step 25 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    ;;
112) # after 160 + 161 (110 + 111 before session 16), kind nvidia-h200-x2 (~7 min): the TP=2 megakernel at this
    # commit (its Gluon kernel is the single-GPU one with TP on, so session 11's GEMV changes reach it): tp_check of the megakernel rows (both
    # backends) on Llama-3.2-1B beside the compile warm-up, `bench --tp 2` of Llama-3.1-8B, then tp_check on it
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    B8="--model llama-3.1-8b --random-weights" TPM="torch+graph,graph,pdl,megakernel"
    mkdir -p "$W/bench" "$W/tp" /tmp/warm
    log "warm-up and tp_check (Llama-3.2-1B)"
    (timeout 170 python3 -m onekernel.cli bench --tp 2 $B8 --batch 1,8 --modes $TPM --allreduce nccl --steps 2 \
        --out /tmp/warm/tp >"$W/warm-tp.log" 2>&1) &
    (timeout 170 python3 scripts/tp_check.py --models llama-3.2-1b --batches 1,8 --steps 8 \
        --modes reference,megakernel,megakernel-gluon --out "$W/tp/tp-check-1b.json" >"$W/tp/tp-check-1b.log" 2>&1) &
    wait
    grep -h '^{' "$W/tp/tp-check-1b.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    step 100 bench-tp-8b $bench/tp --tp 2 $B8 --batch 1,8 --modes $TPM --allreduce nccl --steps 50
    step 150 tp-check-8b python3 scripts/tp_check.py --models llama-3.1-8b --batches 1,8 --steps 8 \
        --modes reference,megakernel,megakernel-gluon --out "$W/tp/tp-check-8b.json"
    ;;
90) # session 10's final commit, kind nvidia-h200-x2 (~9 min; carry .model/smol.p1, parked for 91). Compiles warmed
    # in parallel with the checks (the streaming kernel's GPU tests, bitwise batch invariance at 2/8/16 in every
    # mode, the TP=2 check of Llama-3.2-1B at batch 1); then the batch tables, Llama-3.2-1B on GPU 0 and
    # Llama-3.1-8B on GPU 1 at the same time; then `bench --tp 2` of Llama-3.1-8B on both
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    cp .model/smol.p1 /tmp/model/ 2>/dev/null
    warm() { local gpu=$1 name=$2; shift 2; (timeout 170 env CUDA_VISIBLE_DEVICES=$gpu python3 -m onekernel.cli bench \
             --steps 2 --out /tmp/warm/$name "$@" >"$W/warm-$name.log" 2>&1) & }
    B1="--model llama-3.2-1b --random-weights" B8="--model llama-3.1-8b --random-weights"
    MK="graph,pdl,megakernel" MT="torch+graph,torch+compile"
    mkdir -p "$W/bench" "$W/tp" /tmp/warm
    log "warm-up and checks"
    warm 0 1b $B1 --batch 1,2,4,8,16 --modes $MK
    warm 0 1b-t $B1 --batch 1,2,4,8,16 --modes $MT
    warm 1 8b $B8 --batch 1,2,4,8,16 --modes $MK
    warm 1 8b-t $B8 --batch 1,2,4,8,16 --modes $MT
    (timeout 170 env CUDA_VISIBLE_DEVICES=0 python3 scripts/invariance_check.py llama-3.2-1b \
        --modes eager,graph,pdl,megakernel --out "$W/inv-1b.json" >"$W/inv-1b.log" 2>&1) &
    (timeout 170 env CUDA_VISIBLE_DEVICES=0 TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py \
        -k "mma or auto" -p no:cacheprovider -rfE >"$W/gpu-tests.log" 2>&1) &
    (timeout 170 python3 scripts/tp_check.py --models llama-3.2-1b --batches 1 --steps 8 \
        --out "$W/tp/tp-check-1b.json" >"$W/tp/tp-check-1b.log" 2>&1; echo "rc=$?" >>"$W/tp/tp-check-1b.log") &
    wait
    log "warm-up done: $(grep -l "^wrote" "$W"/warm-*.log | wc -l) of 4 benches finished"
    tail -n 3 "$W/gpu-tests.log" | tee -a "$OUT/log.txt"
    grep -h '"mode"' "$W"/inv-1b.log | cut -c1-200 | tee -a "$OUT/log.txt"
    log "tp_check: $(tail -n 1 "$W/tp/tp-check-1b.log")"
    grep -h '^{' "$W/tp/tp-check-1b.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    (step 170 bench-1b env CUDA_VISIBLE_DEVICES=0 $bench/bench $B1 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50) &
    (step 260 bench-8b env CUDA_VISIBLE_DEVICES=1 $bench/bench $B8 --batch 1,2,4,8,16 --modes $MT,$MK --steps 50) &
    wait
    step 100 bench-tp-8b $bench/tp --tp 2 $B8 --batch 1,8 --modes torch+graph,graph,pdl,megakernel --allreduce nccl \
        --steps 50
    ;;
91) # at once after 90 (warm machine; carry .model/smol.p2): the real default model (5 prompts alone and together,
    # every mode) then 1,000 replays and the forced timeout on GPU 0, beside cold / warm start times on GPU 1; the
    # TP=2 check at batch 1 and 8 (Llama-3.2-1B, Llama-3.1-8B); the SmolLM2 table; the streaming megakernel's
    # profiles (Llama-3.2-1B batch 1 and 16); the TP=2 megakernel profile (Llama-3.1-8B batch 1)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    cat /tmp/model/smol.p1 .model/smol.p2 >"$GGUF" && log "model joined: $(stat -c %s "$GGUF") bytes"
    mkdir -p "$W/bench" "$W/profile" "$W/tp"
    CT="llama-3.2-1b:1:megakernel,llama-3.2-1b:16:megakernel,llama-3.1-8b:1:megakernel,llama-3.1-8b:16:megakernel"
    CT="$CT,llama-3.2-1b:16:graph,llama-3.1-8b:16:graph"
    (step 150 compile-times env CUDA_VISIBLE_DEVICES=1 python3 scripts/compile_times.py --out "$W" --jobs 3 \
        --timeout 60 --cases "$CT") &
    (step 80 greedy-real env CUDA_VISIBLE_DEVICES=0 python3 scripts/greedy_tokens.py "$GGUF" "$W/greedy-real.json";
     step 70 replays env CUDA_VISIBLE_DEVICES=0 python3 scripts/replay_check.py --out "$W/replays.json") &
    wait
    step 170 tp-check python3 scripts/tp_check.py --models llama-3.2-1b,llama-3.1-8b --batches 1,8 --steps 8 \
        --out "$W/tp/tp-check.json"
    # session 13: pdl on the Gluon bodies (pdl-gluon) beside pdl, warmed beside the GPU tests (one 8B process)
    G1="--model llama-3.2-1b --random-weights --batch 1,8" G8="--model llama-3.1-8b --random-weights --batch 1,8"
    (for g in "$G1" "$G8"; do timeout 100 python3 -m onekernel.cli bench --steps 2 --modes pdl,pdl-gluon \
        --out /tmp/warm/g $g; done >"$W/warm-gluon.log" 2>&1) &
    # session 14: the megakernel with the merge tasks (STREAM_FOLD_MERGE=0) beside the folded one, 1B and 8B
    (for g in "$G1" "$G8"; do timeout 100 env STREAM_FOLD_MERGE=0 python3 -m onekernel.cli bench --steps 2 \
        --modes megakernel --out /tmp/warm/s $g; done >"$W/warm-sep.log" 2>&1) &
    step 200 gpu-tests env TRITON_INTERPRET=0 python3 -m pytest -q tests/test_stream_gpu.py -k "mma or auto" \
        -p no:cacheprovider -rfE
    wait
    step 50 bench-135m $bench/bench --model "$GGUF" --batch 1,8 --modes torch+graph,graph,pdl,megakernel --steps 50
    step 40 bench-gluon-1b $bench/bench $G1 --modes pdl,megakernel,pdl-gluon --steps 50
    step 60 bench-gluon-8b $bench/bench $G8 --modes pdl,megakernel,pdl-gluon --steps 50
    mkdir -p "$W/sep"
    step 25 sep-1b env STREAM_FOLD_MERGE=0 $bench/sep $G1 --modes megakernel --steps 50
    step 35 sep-8b env STREAM_FOLD_MERGE=0 $bench/sep $G8 --modes megakernel --steps 50
    step 25 profile-1b python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b
    step 25 profile-1b-16 python3 scripts/stream_profile.py --out "$W/profile" --model llama-3.2-1b --batch 16
    step 50 tp-profile python3 scripts/tp_profile.py --model llama-3.1-8b --batch 1 --out "$W/tp"
    ;;
60) # issue 16, kind nvidia-h200-x4, 1 of 2 (~8 min; run inside `timeout 570`, then pack: see docs/GPU-RUNS.md; 393
    # at once after it on the warm machine). The warm-ups of every step of 60 and 393 in parallel (they only compile:
    # a give-up among them costs nothing), then tp_check.py --tp 4 ALONE on the 4 GPUs (session 40: its checks ran
    # beside three warm-up processes on the same GPUs before; run 8's tp_check lost cases to warm-ups beside it, and
    # call 383's one-shot give-ups came with processes sharing a GPU)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    log "GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
    B8="--model llama-3.1-8b --random-weights" BB="--batch 1,8"
    M1="torch+graph,graph,pdl,megakernel,megakernel-triton"   # TP=1 (single-GPU bench; also tp_check's TP=1 side)
    MT="torch,torch+graph,graph,pdl,megakernel,megakernel-triton"  # TP>1 (bench --tp: every TP mode)
    mkdir -p "$W/bench" "$W/tp" /tmp/warm
    log "warm-ups"
    (timeout 240 env CUDA_VISIBLE_DEVICES=0 python3 -m onekernel.cli bench --out /tmp/warm/tp1 $B8 $BB --modes $M1 \
        --steps 2 >"$W/warm-tp1.log" 2>&1) &
    (timeout 240 env CUDA_VISIBLE_DEVICES=2,3 python3 -m onekernel.cli bench --out /tmp/warm/tp2 --tp 2 $B8 $BB \
        --modes $MT --allreduce nccl --steps 2 >"$W/warm-tp2.log" 2>&1) &
    (timeout 240 python3 -m onekernel.cli bench --out /tmp/warm/tp4 --tp 4 $B8 $BB --modes $MT --steps 2 \
        >"$W/warm-tp4.log" 2>&1) &
    wait
    for f in tp1 tp2 tp4; do log "warm-up $f: $(tail -n 1 "$W/warm-$f.log" | cut -c1-160)"; done
    step 240 tp-check-8b-tp4 python3 scripts/tp_check.py --tp 4 --models llama-3.1-8b --steps 8 --batches 1,8 \
        --modes reference,torch+graph,graph,pdl,megakernel-gluon --out "$W/tp/tp-check-8b-tp4.json"
    grep -h '^{' "$W/tp-check-8b-tp4.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    ;;
393) # issue 16, kind nvidia-h200-x4, 2 of 2 (~5 min, inside `timeout 570`, at once after 60 on the warm machine,
    # whose caches 60 filled):
    # the 8B scaling rows: TP=1 (GPU 0, single-GPU bench) and TP=2 (GPUs 2-3) timed at once on disjoint GPUs, then
    # `bench --tp 4` alone (both all-reduces: nccl, symm)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    B8="--model llama-3.1-8b --random-weights" BB="--batch 1,8"
    M1="torch+graph,graph,pdl,megakernel,megakernel-triton"
    MT="torch,torch+graph,graph,pdl,megakernel,megakernel-triton"
    mkdir -p "$W/bench" "$W/tp"
    (step 130 bench-8b-tp1 env CUDA_VISIBLE_DEVICES=0 $bench/bench $B8 $BB --modes $M1 --steps 50) &
    (step 130 bench-8b-tp2 env CUDA_VISIBLE_DEVICES=2,3 $bench/bench --tp 2 $B8 $BB --modes $MT --allreduce nccl \
        --steps 50) &
    wait
    step 160 bench-8b-tp4 $bench/bench --tp 4 $B8 $BB --modes $MT --steps 50   # both all-reduces: nccl, symm
    ;;
61) # issue 16, kind nvidia-h200-x8, 1 of 2 (~9 min; run inside `timeout 570`, then pack; 394 at once after it). The
    # warm-ups of every step of 61 and 394 in parallel over the 8 GPUs (they only compile: a give-up among them costs
    # nothing), then one job at a time on all 8 GPUs: the Llama-3.1-70B TP=8 table (the issue's target) and the
    # Llama-3.1-8B TP=8 table (nccl; symm is timed at TP=4 in 393). Every bench row carries its own check against the
    # PyTorch TP reference; tp_check.py runs alone in 394 (session 40: it ran beside four warm-ups before).
    # The warm-ups get 260 s: on the 2-core CPU of session 40, before 1f8fec9 took ~17 s off each 70B TP=8 plan, a
    # rank's streaming megakernel took 37 s (batch 1) and 43 s (batch 8) to plan and compile (tp_compile_check.py
    # --backend gluon), the Triton check of batch 1 (the TP=1 shard's and the TP=8 kernel) 82 s (49 s after it).
    # GPU memory, GPU 0 at most during the warm-ups: a 70B rank (17.6 GB shard + the streaming kernel's packed copy,
    # ~40 GB), the TP=1 8B warm-up for tp_check's TP=1 side (~35 GB), three 8B ranks (~5 GB each): ~90 GB of 141.
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    log "GPUs: $(nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' ')"
    B8="--model llama-3.1-8b --random-weights" B70="--model llama-3.1-70b --random-weights" BB="--batch 1,8"
    MT="torch,torch+graph,graph,pdl,megakernel,megakernel-triton"
    SM="--tp 8 --model llama-3.1-8b --batches 1 --ks 0,8,16 --ar-tiles fit,16"
    mkdir -p "$W/bench" "$W/tp" /tmp/warm
    log "warm-ups"
    (timeout 260 env CUDA_VISIBLE_DEVICES=0 python3 -m onekernel.cli bench --out /tmp/warm/tp1 $B8 $BB \
        --modes torch+graph,graph,pdl,megakernel --steps 2 >"$W/warm-tp1.log" 2>&1) &
    (timeout 260 python3 -m onekernel.cli bench --out /tmp/warm/70b --tp 8 $B70 $BB --modes $MT --allreduce nccl \
        --steps 2 >"$W/warm-70b.log" 2>&1) &
    (timeout 260 python3 -m onekernel.cli bench --out /tmp/warm/8b --tp 8 $B8 $BB --modes $MT --allreduce nccl --steps 2 \
        >"$W/warm-8b.log" 2>&1) &
    (timeout 260 python3 scripts/tp_profile.py --tp 8 --model llama-3.1-8b --batch 1 --steps 1 --out /tmp/warm/prof \
        >"$W/warm-prof.log" 2>&1) &
    (timeout 260 python3 scripts/tp_sm_study.py $SM --steps 2 --out /tmp/warm/sm >"$W/warm-sm.log" 2>&1) &
    wait
    for f in tp1 70b 8b prof sm; do log "warm-up $f: $(tail -n 1 "$W/warm-$f.log" | cut -c1-160)"; done
    step 170 bench-70b-tp8 $bench/bench --tp 8 $B70 $BB --modes $MT --allreduce nccl --steps 50
    step 90 bench-8b-tp8 $bench/bench --tp 8 $B8 $BB --modes $MT --allreduce nccl --steps 50
    ;;
394) # issue 16, kind nvidia-h200-x8, 2 of 2 (~5.5 min, inside `timeout 570`, at once after 61 on the warm machine):
    # one job at a time on all 8 GPUs: tp_check.py --tp 8 on Llama-3.1-8B alone (TP=8 logits and greedy tokens
    # against TP=1 on GPU 0; its pdl-symm and TP=1 kernels may compile here), the TP=8 megakernel profile (PNG), the
    # SM-reservation study at TP=8
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ONEKERNEL_TP_TIMEOUT=50
    SM="--tp 8 --model llama-3.1-8b --batches 1 --ks 0,8,16 --ar-tiles fit,16"
    mkdir -p "$W/tp"
    step 240 tp-check-8b-tp8 python3 scripts/tp_check.py --tp 8 --models llama-3.1-8b --steps 8 --batches 1,8 \
        --modes reference,torch+graph,graph,pdl,megakernel-gluon --out "$W/tp/tp-check-8b-tp8.json"
    grep -h '^{' "$W/tp-check-8b-tp8.log" | cut -c1-300 | tee -a "$OUT/log.txt"
    step 40 tp-profile-8b python3 scripts/tp_profile.py --tp 8 --model llama-3.1-8b --batch 1 --out "$W/tp"
    step 55 tp-sm-study python3 scripts/tp_sm_study.py $SM --steps 50 --out "$W/tp"
    ;;
esac
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv >>"$OUT/log.txt" 2>&1
tar -czf "$OUT/results.tgz" -C "$W" . && log "packed $(ls "$W" | wc -l) files"
