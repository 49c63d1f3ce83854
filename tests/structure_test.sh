#!/usr/bin/env bash
# The layout rules of README's architecture section, checked on the source (issue 30), so that the
# house stays readable as code lands:
#  - nothing in src/sched includes src/run (schedules sit below the loop, on the step contract);
#  - no cycle between the folders of src/ (an include of folder B from folder A is an edge A -> B);
#  - no host source file (src/, tools/) over 1,000 lines;
#  - no __global__ kernel inside a backslash macro;
#  - getenv only for the variables README's "Environment variables" table documents;
#  - `train --help` lists every schedule of the registry (src/sched/sched.c);
#  - the binary does not link cuBLAS(Lt): it is opened at the first GPU backend (src/core/
#    cublaslt_load.c), since loading it cost every command ~0.35 s.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

bad=$(grep -rln '#include "run/' src/sched)
[ -z "$bad" ] && pass "src/sched includes nothing of src/run" || fail "src/sched includes src/run: $bad"

# folder edges from the quoted includes, then a topological sort: tsort names a loop if there is one
grep -rHo '#include "[a-z_]*/' src --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' |
    awk -F'[/"]' '{ if ($2 != $(NF - 1)) print $2, $(NF - 1) }' | sort -u |
    while read -r from to; do [ -d "src/$to" ] && echo "$from $to"; done > "$TMP/edges"
if tsort "$TMP/edges" > /dev/null 2> "$TMP/loop"; then
    pass "no include cycle between the $(tr ' ' '\n' < "$TMP/edges" | sort -u | wc -l) folders of src/ ($(wc -l < "$TMP/edges") edges)"
else
    fail "the folders of src/ include each other in a loop: $(tr '\n' ' ' < "$TMP/loop")"
fi

long=$(find src tools -name '*.c' -o -name '*.h' | xargs wc -l | awk '$2 != "total" && $1 > 1000 {print $2 " (" $1 ")"}')
[ -z "$long" ] && pass "no host source file over 1,000 lines (longest: $(find src tools -name '*.c' -o -name '*.h' | xargs wc -l | grep -v total | sort -n | tail -n 1 | awk '{print $2, $1}'))" \
    || fail "host source files over 1,000 lines: $long"

# a line holding __global__ that continues a macro (the line before ends with a backslash)
macro=$(find src -name '*.cu' -o -name '*.cuh' | xargs awk 'FNR == 1 {prev = ""} prev ~ /\\[ \t]*$/ && /__global__/ {print FILENAME ":" FNR} {prev = $0}')
[ -z "$macro" ] && pass "no __global__ kernel inside a macro" || fail "__global__ inside a macro: $macro"

undoc=""
for v in $(grep -rhoE 'getenv\("[A-Za-z_0-9]+"\)' src tools | cut -d'"' -f2 | sort -u); do
    grep -q "^| \`$v\`" README.md || undoc="$undoc $v"
done
[ -z "$undoc" ] && pass "every variable getenv reads is in README's environment table" || fail "getenv of undocumented variables:$undoc"

names=$(grep -oE '\.name *= *"[a-z-]+"' src/sched/*.c | cut -d'"' -f2 | sort -u)
[ -n "$names" ] || fail "no schedule names found in src/sched"
help=$($NB train --help 2>&1)
missing=""
for n in $names; do grep -qE "^  $n " <<< "$help" || missing="$missing $n"; done
[ -z "$missing" ] && pass "train --help lists every schedule: $(echo $names)" || fail "train --help misses schedules:$missing"

linked=$(ldd "$NB" 2>/dev/null | grep -o 'libcublas[A-Za-z]*\.so[.0-9]*' | sort -u | tr '\n' ' ')
[ -z "$linked" ] && pass "nobubble links no cuBLAS library (opened when a GPU backend needs it)" \
    || fail "nobubble links $linked: every command pays its load time"
finish
