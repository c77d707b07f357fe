#!/bin/sh
# CTest papers_vllm_sosp23_plot: papers/vllm-sosp23/reproduce.py --plot, once, on the project's Python
# ($KVPAGE_PYTHON, default /usr/bin/python3), into a fresh folder: it must exit 0 and draw a non-empty PNG.
# Exit 77 (shown as skipped) only when that interpreter has no matplotlib (scripts/install-deps.sh installs it).
set -u
py=${KVPAGE_PYTHON:-/usr/bin/python3}
bin=${KVPAGE_BIN:?KVPAGE_BIN is not set (run through ctest)}
if ! "$py" -c 'import matplotlib' 2>/dev/null; then
    echo "SKIP: $py has no matplotlib (scripts/install-deps.sh installs python3-matplotlib)"
    exit 77
fi
out=$(mktemp -d /tmp/kvp_plot_XXXXXX) || exit 1
"$py" papers/vllm-sosp23/reproduce.py --kvpage "$bin" --out "$out" --plot > "$out/stdout" 2> "$out/stderr"
rc=$?
if [ $rc -ne 0 ]; then
    echo "reproduce.py --plot exited $rc:"; tail -20 "$out/stderr"; rm -rf "$out"; exit 1
fi
if [ ! -s "$out/vllm_sosp23.png" ]; then
    echo "reproduce.py --plot drew no $out/vllm_sosp23.png"; rm -rf "$out"; exit 1
fi
echo "ok: $(wc -c < "$out/vllm_sosp23.png") bytes of PNG, $(grep -c '| ok |' "$out/stdout") claims within their bands"
rm -rf "$out"
