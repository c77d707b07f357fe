#!/usr/bin/env bash
# bench/gpu_bundle.sh — packs a kvpage program with the shared libraries it needs into one .tar.xz, for a GPU
# machine that has the CUDA toolkit but not the project's libraries (cJSON, xxHash, OpenBLAS, libmicrohttpd,
# PCRE2, libcurl, jemalloc, Open MPI and what they pull in), and no network to install them:
#
#   kvpage/bin/kvpage   the program (build it with nvcc: cmake -DKVPAGE_CUDA=ON, then --target kvpage)
#   kvpage/lib/         every library `ldd` resolves for it, except the C library's own, libgcc_s, libstdc++
#                       and CUDA's (libcuda, libcudart, libcublas, libcublasLt, libnccl: the GPU machine's
#                       driver, toolkit and NCCL give those, of the same CUDA major version; libnccl alone is
#                       some 200 MB, over what a device call carries)
#   kvpage/kvpage       a wrapper: LD_LIBRARY_PATH=lib (then the toolkit's lib64) and exec bin/kvpage
#
# On the GPU machine: KVPAGE_BUNDLE=that.tar.xz bench/gpu_check.sh (it unpacks it and runs kvpage/kvpage), or
# unpack it and give KVPAGE_BIN=.../kvpage/kvpage. The libraries come from the building machine's system, so
# that machine's C library must not be newer than the GPU machine's.
# Usage: bench/gpu_bundle.sh [KVPAGE [OUT.tar.xz]]   (defaults build/kvpage, build-gpu/kvpage-bundle.tar.xz;
# XZ_OPT=-0 packs faster and larger)
set -euo pipefail
KV=${1:-build/kvpage}
OUTF=${2:-build-gpu/kvpage-bundle.tar.xz}
[ -x "$KV" ] || { echo "gpu_bundle: no kvpage program at $KV" >&2; exit 2; }
ldd "$KV" >/dev/null 2>&1 || { echo "gpu_bundle: $KV is not a dynamic executable ldd can read" >&2; exit 2; }
if ldd "$KV" | grep -q 'not found'; then
  echo "gpu_bundle: $KV misses libraries here: $(ldd "$KV" | grep 'not found' | tr -s ' \t\n' ' ')" >&2
  exit 2
fi
ldd "$KV" | grep -q libcublas || echo "gpu_bundle: warning: $KV links no cuBLAS: it was built without nvcc" \
  "and has no device layer (--device cuda will say so)" >&2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/kvpage/bin" "$TMP/kvpage/lib" "$(dirname "$OUTF")"
cp "$KV" "$TMP/kvpage/bin/kvpage"
ldd "$KV" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$TMP/kvpage/lib/"; done
cat >"$TMP/kvpage/kvpage" <<'EOF'
#!/bin/sh
# kvpage with the libraries bench/gpu_bundle.sh packed beside it (then the CUDA toolkit's).
d=$(cd "$(dirname "$0")" && pwd)
cuda=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")
LD_LIBRARY_PATH="$d/lib:$cuda/lib64:$cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/bin/kvpage" "$@"
EOF
chmod +x "$TMP/kvpage/kvpage"
tar -C "$TMP" -cJf "$OUTF" kvpage
echo "gpu_bundle: $OUTF: kvpage and $(find "$TMP/kvpage/lib" -type f | wc -l) libraries," \
  "$(du -m "$OUTF" | cut -f1) MiB" >&2
