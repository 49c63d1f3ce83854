# Shared helpers for the shell tests (sourced). NB_BUILD is the build folder (tests/run.sh sets it).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NB_BUILD=${NB_BUILD:-build}
case $NB_BUILD in /*) ;; *) NB_BUILD=$ROOT/$NB_BUILD ;; esac
NB=$NB_BUILD/nobubble
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Open MPI's session directory in this test's own folder: tests/run.sh runs tests side by side, and
# two mpiruns sharing /tmp/ompi.HOST.UID can race (one's cleanup under the other's start:
# "orte_session_dir failed", seen once in pipe_test)
export OMPI_MCA_orte_tmpdir_base=$TMP
fails=0
# python3 resolved once: a version manager's shim (pyenv's) costs ~0.3 s a call, and some tests
# call python3 dozens of times; the function runs the interpreter the shim would pick.
if NB_PY=$(command python3 -c 'import sys; print(sys.executable)' 2>/dev/null) && [ -x "$NB_PY" ]; then
    python3() { "$NB_PY" "$@"; }
    export NB_PY
    export -f python3
fi
# What a CPU run sets itself when it is unset (tools/nobubble.c restarts the process to do so, which
# loads the CUDA libraries a second time: ~0.35 s a command, hundreds of commands here). Left as is
# where there is a GPU: GPU runs keep libgomp's default.
command -v nvidia-smi >/dev/null 2>&1 || export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; fails=$((fails+1)); }
finish() { [ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }; exit 0; }

# losses DIR: the per-step training losses of a run directory's metrics.jsonl, one per line.
losses() { grep -o '"loss":[0-9.e+-]*' "$1/metrics.jsonl" | cut -d: -f2; }
# worst_loss_diff DIR_A DIR_B: the largest relative difference between the two runs' step losses.
worst_loss_diff() {
    paste <(losses "$1") <(losses "$2") | awk '{d=($1-$2)/$1; if (d<0) d=-d; if (d>w) w=d} END {printf "%.3g", w}'
}

# same_state NAME DIR_A DIR_B: the two runs end with the same bits (weights, optimizer state) and
# logged the same steps, losses and gradient norms.
# st_same A B: two safetensors files of one binary hold the same tensor bytes (the data after the
# header: the header's __metadata__ carries the run's fingerprint, which other options, e.g. ranks vs
# --grad-accum, change over the same tensors; one binary lays the tensors out the same way)
st_same() {
    local na=$(od -An -tu8 -N8 "$1" | tr -d ' ') nb=$(od -An -tu8 -N8 "$2" | tr -d ' ')
    [ -n "$na" ] && [ -n "$nb" ] && [ "$(stat -c %s "$1")" -eq $(( $(stat -c %s "$2") - nb + na )) ] \
        && cmp -s <(tail -c +$((9 + na)) "$1") <(tail -c +$((9 + nb)) "$2")
}
same_state() {
    st_same "$2/ckpt/model.safetensors" "$3/ckpt/model.safetensors" && st_same "$2/ckpt/optim.safetensors" "$3/ckpt/optim.safetensors" \
        && [ -n "$(losses "$2")" ] && [ "$(cut -d, -f1-4 "$2/metrics.jsonl")" = "$(cut -d, -f1-4 "$3/metrics.jsonl")" ] \
        && pass "$1: bitwise (weights, optimizer state, losses, gradient norms)" || fail "$1: differs"
}

# expect_error_ranks NAME PATTERN CMD...: like expect_error for an mpirun job, where every rank
# may print the error before the job ends: a non-zero exit (not a timeout or a crash of ours) and
# an error line matching PATTERN.
expect_error_ranks() {
    local name=$1 pat=$2; shift 2
    timeout 120 "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then fail "$name: exit code $rc"; tail -5 "$TMP/err"; return; fi
    grep -q "Segmentation\|core dumped\|AddressSanitizer" "$TMP/err" && { fail "$name: crashed"; tail -5 "$TMP/err"; return; }
    local line=$(grep -m1 "error:.*$pat" "$TMP/err")
    [ -n "$line" ] && pass "$name: $line" || { fail "$name: no error line matching '$pat'"; tail -5 "$TMP/err"; }
}

# The default corpus; fetched once (the fetch script caches it under data/).
need_sotu() {
    if [ ! -f "$ROOT/data/sotu/train.bin" ] || [ ! -f "$ROOT/data/sotu/val.bin" ]; then
        NB_BUILD=$NB_BUILD bash "$ROOT/scripts/fetch_data.sh" all >/dev/null || { echo "cannot fetch data (npm unreachable?)"; exit 77; }
    fi
    TRAIN=$ROOT/data/sotu/train.bin
    VAL=$ROOT/data/sotu/val.bin
}

# expect_error NAME PATTERN CMD...: CMD must exit 1 or 2 (not crash); stderr must end with one
# error line ("nobubble...error:...PATTERN") and hold no other error line (the configuration
# printed before it is fine).
expect_error() {
    local name=$1 pat=$2; shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    local nerr=$(grep -c "error:" "$TMP/err") last=$(tail -n 1 "$TMP/err")
    if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then fail "$name: exit code $rc (want 1 or 2)"; tail -5 "$TMP/err"; return; fi
    if [ "$nerr" -ne 1 ]; then fail "$name: $nerr error lines on stderr (want 1)"; tail -5 "$TMP/err"; return; fi
    if ! echo "$last" | grep -q "^nobubble.*error:.*$pat"; then fail "$name: last line does not match '$pat':"; tail -3 "$TMP/err"; return; fi
    pass "$name: $last"
}

# mask_shard SRC OUT N MODE: the first N tokens of SRC (ids folded below 32000) as OUT, and OUT.mask
# by MODE: none (no mask file), ones, zeros, runs (prompt-like runs of 0, then response-like runs of 1)
mask_shard() {
    python3 - "$@" <<'PYEOF'
import struct, sys, random
src, out, n, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
b = open(src, "rb").read()
ids = [t % 32000 for t in struct.unpack_from("<%dH" % n, b, 1024)]
open(out, "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack("<%dH" % n, *ids))
if mode == "none":
    sys.exit(0)
if mode == "runs":
    rng, m = random.Random(7), []
    while len(m) < n:
        m += [0] * rng.randint(3, 40) + [1] * rng.randint(3, 60)
    m = m[:n]
else:
    m = [1 if mode == "ones" else 0] * n
open(out + ".mask", "wb").write(struct.pack("<256i", 20261205, 1, n, *([0] * 253)) + bytes(m))
PYEOF
}

# lcg_awk N SEED PROGRAM: awk PROGRAM with n = N and r(m), a deterministic draw in 0..m-1 (an LCG
# from SEED), for tests that write the same pseudo-random rows on every machine
lcg_awk() {
    awk -v n="$1" -v seed="$2" 'function r(m) { seed = (seed * 1103515245 + 12345) % 2147483648; return int(seed / 65536) % m }'"$3"
}
