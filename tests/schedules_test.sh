#!/usr/bin/env bash
# Every registered schedule against plain, for both model families: one table, a row per
# (family, schedule, flags). Same seed, same data, same steps: the losses, gradient norms,
# weights and optimizer state must be bitwise plain's (a schedule changes when work runs, never
# what is computed). A schedule that does not run a family has an "n/a" row: it must refuse with
# one clear error line. Adding a schedule = a row here (the test fails for a schedule that
# 'nobubble info' lists and no row covers, for either family).
source "$(dirname "$0")/lib.sh"
need_sotu
TF=(--model gpt2-tiny --layers 4 --batch 2 --steps 6 --data "$TRAIN" --val-data none --no-progress --quiet --seed 7)
SC=(--model seqctr --data "synth:cap=1000,items=2000,calib=16384,max_len=16" --emb-dim 16 --blocks 4 --cross-rank 16
    --block-hidden 32 --batch 64 --steps 6 --eval-samples 256 --quiet)
# family | schedule | flags both runs share | flags of the schedule's run only
ROWS=(
    "transformer|erase|--detach 1,3|--erase-dispatch blocking --side-lanes 2"
    "transformer|erase|--detach 1,3|--erase-dispatch async --side-lanes 1"
    "transformer|erase|--detach 2 --graphs|--erase-dispatch blocking"
    "transformer|erase||"
    "transformer|stream||--ckpt-interval 2 --stream-slots -1"
    "transformer|stream|--grad-clip 0|--gpu-layers 2"
    "llama|erase|--detach 1|--erase-dispatch async"
    "llama|stream||--ckpt-interval 1"
    "seqctr|erase|--detach all|--erase-dispatch blocking --side-lanes 4"
    "seqctr|erase|--detach 2|--erase-dispatch async --side-lanes 2"
    "seqctr|erase|--detach all --emb-optim adam --graphs|--erase-dispatch blocking"
    "seqctr|stream|n/a|does not run seqctr"
    "seqctr|pipe|--emb-shard row|"
    "seqctr|pipe|--emb-shard row --emb-optim adam --graphs|"
    "seqctr|pipe|--emb-shard row --micro-batches 2 --graphs|--graph-cache 1"
    "transformer|pipe|n/a|does not run transformer"
    "seqctr|sparse-dist|--emb-shard row|"
    "transformer|sparse-dist|n/a|does not run transformer"
)
family_args() { case $1 in transformer) echo "${TF[@]}";; llama) echo "${TF[@]/gpt2-tiny/llama-tiny}";; seqctr) echo "${SC[@]}";; esac; }
same() { # same NAME DIR_A DIR_B
    local a=$2 b=$3 ok=1
    [ -n "$(losses "$a")" ] && [ "$(losses "$a")" = "$(losses "$b")" ] || ok=0
    [ "$(grep -o '"grad_norm":[^,]*' "$a/metrics.jsonl")" = "$(grep -o '"grad_norm":[^,]*' "$b/metrics.jsonl")" ] || ok=0
    cmp -s "$a/ckpt/model.safetensors" "$b/ckpt/model.safetensors" && cmp -s "$a/ckpt/optim.safetensors" "$b/ckpt/optim.safetensors" || ok=0
    [ $ok -eq 1 ] && pass "$1: bitwise plain (losses, norms, weights, optimizer state)" || fail "$1: differs from plain"
}
covered=" "
i=0
for row in "${ROWS[@]}"; do
    IFS='|' read -r fam sched shared own <<< "$row"
    i=$((i+1))
    fam_base=$fam; [ "$fam" = llama ] && fam_base=transformer
    covered="$covered$fam_base:$sched "
    if [ "$shared" = n/a ]; then
        expect_error "$fam --schedule $sched" "$own" $NB train $(family_args "$fam") --schedule "$sched" --out "$TMP/na$i"
        continue
    fi
    $NB train $(family_args "$fam") $shared --schedule plain --out "$TMP/p$i" >/dev/null 2>&1 || { fail "$fam plain $shared"; continue; }
    $NB train $(family_args "$fam") $shared --schedule "$sched" $own --out "$TMP/s$i" >/dev/null 2>&1 || { fail "$fam $sched $shared $own"; continue; }
    same "$fam: --schedule $sched $shared $own" "$TMP/p$i" "$TMP/s$i"
done
for sched in $($NB info | sed -n 's/^schedules *//p'); do
    [ "$sched" = plain ] && continue
    for fam in transformer seqctr; do
        case $covered in *" $fam:$sched "*) ;; *) fail "no row for --schedule $sched with $fam (add one, or an n/a row)";; esac
    done
done
finish
