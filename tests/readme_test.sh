#!/usr/bin/env bash
# The README's commands run as written (issue 36): every nobubble command in its sh/bash code
# blocks, in the order they appear, from a scratch folder where ./build and ./data are this
# checkout's. Only the step counts are cut (600 -> 6, none given -> 2), and seqctr's held-out
# samples (2,048 unless the command sets them), so that CI runs them in seconds; everything else (flags, paths, mpirun lines, resume and eval of the
# runs made just before) is the README's text. Skipped, and listed: commands for a GPU, and those
# that need files the project cannot fetch (Criteo, fineweb, your own shards and CSV files), and
# the two that take a minute each on 2 cores unless NB_README_ALL=1 (evaluating all of val.bin,
# 4 ranks on histories of 1,024).
source "$(dirname "$0")/lib.sh"
need_sotu
cd "$TMP" && ln -s "$NB_BUILD" build && ln -s "$ROOT/data" data

python3 - "$ROOT/README.md" > cmds.txt <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
for block in re.findall(r"```(?:sh|bash)?\n(.*?)```", text, re.S):
    block = re.sub(r"\\\n\s*", " ", block)
    for line in block.split("\n"):
        line = line.strip()
        if line.startswith("#") or "build/nobubble" not in line:
            continue
        line = re.sub(r"\s+#.*$", "", line)  # a trailing comment ('#' inside quotes is not used)
        # the setup prefix of command 1 runs elsewhere in CI: keep the nobubble part
        line = re.sub(r"^.*&& (\./build/nobubble )", r"\1", line)
        print(line)
PYEOF

# why_skip CMD: a reason this machine cannot run CMD, or nothing
why_skip() {
    case "$1" in
    *--device\ cuda* | *cuda:*) echo "needs a GPU" ;;
    *criteo:train.txt* | *--in\ train.txt* | *day_1.gz* | *runs/criteo*) echo "needs Criteo's files (not fetchable here)" ;;
    *fineweb* | *data/a.bin*) echo "needs your own shards" ;;
    *models/*) echo "needs a Hugging Face checkpoint you download (tests/import_test.sh runs this path on tiny models)" ;;
    *sft.bin* | *runs/sft*) echo "reads what a skipped command makes" ;;
    *csv:train.csv* | *runs/mine*) echo "needs your own CSV and schema (tests/ctr_schema_test.sh trains such files)" ;;
    *movielens*) [ -d data/movielens ] || echo "needs data/movielens (scripts/fetch_data.sh movielens)" ;;
    *--batches\ 0* | *max_len=1024*)
        # about a minute each on CI's 2 cores, where the whole suite has 20 minutes
        [ -n "${NB_README_ALL:-}" ] || echo "a minute on 2 cores; NB_README_ALL=1 runs it too" ;;
    *) for d in $(grep -oE -- '--(ckpt|resume|trace) runs/[^ ]+' <<< "$1" | cut -d' ' -f2); do
           [ -e "$d" ] || { echo "reads $d, which a skipped command makes"; break; }
       done ;;
    esac
}

# shorten CMD: train runs cut to a few steps (--steps N -> N/100, at least 2, none given -> 2; --stop-after alike)
shorten() {
    local c=$1
    case "$c" in *" train "*) ;; *) echo "$c"; return ;; esac
    case "$c" in *--resume*) echo "$c"; return ;; esac
    c=$(sed -E 's/--(steps|stop-after) ([0-9]+)/--\1 \2__SCALE__/g' <<< "$c" | \
        awk '{ while (match($0, /[0-9]+__SCALE__/)) { n = substr($0, RSTART, RLENGTH - 9) / 100; if (n < 2) n = 2;
               $0 = substr($0, 1, RSTART - 1) int(n) substr($0, RSTART + RLENGTH) } print }')
    case "$c" in *--steps*) ;; *) c="$c --steps 2" ;; esac
    # seqctr's held-out set too (16,384 samples, evaluated twice: the model's and the teacher's
    # loss): on 2 cores the evaluation of a 2-step run took most of its time
    case "$c" in *"--model seqctr"*) case "$c" in *--eval-samples*) ;; *) c="$c --eval-samples 2048" ;; esac ;; esac
    echo "$c --no-progress"
}

ran=0 skipped=0 t0=$(date +%s)
while IFS= read -r cmd; do
    why=$(why_skip "$cmd")
    if [ -n "$why" ]; then
        echo "skip $cmd   ($why)"
        skipped=$((skipped + 1))
        continue
    fi
    run=$(shorten "$cmd")
    c0=$(date +%s)
    if timeout 300 bash -c "$run" < /dev/null > out.log 2>&1; then
        pass "$run ($(( $(date +%s) - c0 )) s)"
    else
        fail "$run (exit $?)"
        tail -5 out.log
    fi
    ran=$((ran + 1))
done < cmds.txt
[ $ran -ge 10 ] && pass "$ran README commands ran as written, $skipped skipped ($(( $(date +%s) - t0 )) s)" \
    || fail "only $ran README commands ran ($skipped skipped)"
finish
