#!/usr/bin/env bash
# scripts/check-includes.sh — the layering rules of docs/architecture.md, checked on the sources:
#   1. no include cycle among the project's headers;
#   2. no cycle between the files of one folder once a .c and its .h (and its *_internal.h) count as one
#      unit: attention/paged_kv.c including attention.h, which includes paged_kv.h, is such a cycle;
#   3. no include that points up or sideways between layers (the order below, from the bottom up);
#   4. with --objects BUILD_DIR, no call cycle between the objects of one static library (nm: an object that
#      needs a symbol another defines depends on it), e.g. a dispatcher that calls radix.c while radix.c
#      calls back into it. Libraries that still have such cycles are listed in KNOWN_CALL_CYCLES.
# Prints every violation with the file and the include (or the cycle) and exits 1 if there is one, else 0.
# Usage: scripts/check-includes.sh [--objects BUILD_DIR]   (run from anywhere; CTest runs both forms)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
objects=""
while [ $# -gt 0 ]; do
  case "$1" in
    --objects) objects=${2:?--objects needs the build folder}; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-includes: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# Layers from the bottom up (docs/architecture.md, "Layers"). A file may include its own module and the
# modules of lower levels only; modules of one level do not include each other.
layer_of() {
  case "$1" in
    common) echo 0 ;;
    blockmgr|attention|parallel) echo 1 ;;
    prefix_cache) echo 2 ;;
    runtime/loader) echo 3 ;;
    runtime/model) echo 4 ;;
    runtime/text) echo 5 ;;
    runtime/engine) echo 6 ;;
    runtime/workload) echo 7 ;;
    runtime/executor) echo 8 ;;
    runtime/planner|runtime/server) echo 9 ;;
    bench) echo 10 ;;
    runtime/cli) echo 11 ;;
    *) echo "" ;;
  esac
}
# Pairs the doc rules out beyond the order: "engine/ needs none of these" (text, model, loader).
forbidden() {
  case "$1 $2" in
    "runtime/engine runtime/text"|"runtime/engine runtime/model"|"runtime/engine runtime/loader") return 0 ;;
  esac
  return 1
}
# Known violations, "file -> included header", each with the change that removes it. Reported, not failed.
KNOWN_UPWARD=()
# Libraries whose objects still call each other in a cycle (engine.c <-> scheduler.c / output.c, model.c <->
# weights.c / rope.c, bench.c <-> its subcommands, server/'s http.c, openai.c, stream.c, metrics.c and
# engine_loop.c). Reported, not failed; every other library must be acyclic.
KNOWN_CALL_CYCLES=(libkvp_bench.a libkvp_engine.a libkvp_model.a libkvp_server.a)

fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Every project include: "file header" for headers that exist under the root (system and generated headers,
# such as kvp_commit.h, are not the project's).
find common blockmgr attention parallel prefix_cache runtime bench \
  \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print | sort > "$tmp/files"
while read -r f; do
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r h; do
    if [ -f "$h" ]; then echo "$f $h"; fi
  done
done < "$tmp/files" > "$tmp/edges"

# tsort prints the members of each loop it finds on stderr, after a line "input contains a loop".
loops() { tsort "$1" 2>&1 >/dev/null | sed 's/^tsort: //; s/^.*input contains a loop:$/loop:/' || true; }

# 1. header cycles
grep -E '\.(h|cuh) ' "$tmp/edges" | awk '$1 != $2' > "$tmp/hh" || true
out=$(loops "$tmp/hh")
if [ -n "$out" ]; then
  echo "check-includes: include cycle among headers:"; echo "$out" | sed 's/^/  /'; fail=1
fi

# 2. unit cycles within a folder
awk 'function dir(p) { sub(/\/[^\/]*$/, "", p); return p }
     function unit(p) { sub(/\.[a-z]+$/, "", p); sub(/_internal$/, "", p); return p }
     dir($1) == dir($2) && unit($1) != unit($2) { print unit($1), unit($2) }' "$tmp/edges" | sort -u > "$tmp/uu"
out=$(loops "$tmp/uu")
if [ -n "$out" ]; then
  echo "check-includes: include cycle between the files of a folder (a .c and its .h are one unit):"
  echo "$out" | sed 's/^/  /'
  while read -r a b; do # name the includes that close each loop
    if echo "$out" | grep -qx "$a" && echo "$out" | grep -qx "$b"; then
      grep -E "^$a(_internal)?\.[a-z]+ $b(_internal)?\.(h|cuh)$" "$tmp/edges" | sed 's/ / includes /; s/^/    /'
    fi
  done < "$tmp/uu"
  fail=1
fi

# 3. layers: the module pairs first (few), then the files of a pair that breaks the order
awk 'function mod(p, a, n) { n = split(p, a, "/"); return a[1] == "runtime" && n >= 3 ? a[1] "/" a[2] : a[1] }
     { a = mod($1); b = mod($2); if (a != b) print a, b, $1, $2 }' "$tmp/edges" > "$tmp/mm"
while read -r a b; do
  la=$(layer_of "$a") lb=$(layer_of "$b")
  if [ -z "$la" ] || [ -z "$lb" ]; then
    echo "check-includes: module '$a' or '$b' has no layer in $0 (an include from $a to $b)"; fail=1; continue
  fi
  if [ "$lb" -lt "$la" ] && ! forbidden "$a" "$b"; then continue; fi
  why="points up"
  [ "$lb" -eq "$la" ] && why="points sideways (one layer)"
  forbidden "$a" "$b" && why="is ruled out by docs/architecture.md"
  while read -r _ _ f h; do
    known=0
    for k in "${KNOWN_UPWARD[@]}"; do [ "$k" = "$f -> $h" ] && known=1; done
    if [ $known = 1 ]; then
      echo "check-includes: note: known exception: $f includes $h ($a -> $b $why)"
    else
      echo "check-includes: $f includes $h: $a -> $b $why (docs/architecture.md, Layers)"; fail=1
    fi
  done < <(awk -v a="$a" -v b="$b" '$1 == a && $2 == b' "$tmp/mm")
done < <(cut -d' ' -f1,2 "$tmp/mm" | sort -u)

# 4. call cycles between the objects of each library
if [ -n "$objects" ]; then
  libs=$(find "$objects" -name 'libkvp_*.a' -not -path '*/tests/*' | sort)
  [ -n "$libs" ] || { echo "check-includes: no libkvp_*.a under $objects (build first)"; exit 2; }
  for lib in $libs; do
    nm -A --defined-only -g "$lib" 2>/dev/null |
      awk 'NF == 3 && $2 ~ /[TDBRVWCG]/ { n = split($1, a, ":"); print a[n - 1], $3 }' | sort -k2 > "$tmp/def"
    nm -A -u "$lib" 2>/dev/null | awk '{ n = split($1, a, ":"); print a[n - 1], $NF }' | sort -k2 > "$tmp/und"
    join -1 2 -2 2 "$tmp/und" "$tmp/def" | awk '$2 != $3 { print $2, $3 }' | sort -u > "$tmp/oo"
    out=$(loops "$tmp/oo")
    [ -z "$out" ] && continue
    name=$(basename "$lib") known=0
    for k in "${KNOWN_CALL_CYCLES[@]}"; do [ "$k" = "$name" ] && known=1; done
    members=$(echo "$out" | grep -vx 'loop:' | sort -u | tr '\n' ' ')
    if [ $known = 1 ]; then
      echo "check-includes: note: known call cycle in $name: $members"
    else
      echo "check-includes: call cycle between the objects of $name: $members"; fail=1
    fi
  done
fi

if [ $fail = 0 ]; then
  echo "check-includes: ok ($(wc -l < "$tmp/edges") includes in $(wc -l < "$tmp/files") files${objects:+; objects of $objects})"
fi
exit $fail
