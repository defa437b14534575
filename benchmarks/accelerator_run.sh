#!/bin/bash
# Issue #19's check on a lent accelerator (H100 or H200), in one call of the device tool:
#
#     bash benchmarks/accelerator_wheels.sh     # here, first (in the project's venv)
#     run(command="bash benchmarks/accelerator_run.sh", carry=[".whl"], timeout_s=560)
#
# There it installs the carried wheels (.whl/: TFDS, ml_collections) into $SITE, then smoke-
# tests the image's JAX / Flax / optax / orbax with one toy part of accelerator_check.py (the
# demo-sized bf16 train step on the accelerator: it builds, compiles and runs a model). The
# image's Flax, optax and orbax versions are not known ahead; if the smoke run fails, the
# versions this project's suite passes with (.whl/pinned/) are installed over them and the
# smoke run is tried once more. SMOKE=0 skips the smoke run (and so the fallback): for a call
# on an image whose stack passed it before (benchmarks/results/), it saves its 40 s. Then the
# whole check runs with what is left of $BUDGET_S (default 480 s, the issue's 8 minutes, smoke
# run included). Arguments are passed on to accelerator_check.py (e.g. `--parts demo` for what
# a first run skipped).
#
# Written under $OUT (the device tool's folder that comes back): log.txt (everything printed),
# smoke_image.json (and smoke_pinned.json if it came to that), accelerator_check.json (the
# summary). Exit status: 0 when every part that ran is ok, else 1 (see the summary).
set -u
cd "$(dirname "$0")/.."
: "${OUT:=/tmp/accelerator_check}" "${BUDGET_S:=480}" "${SITE:=/tmp/site}" "${PYTHON:=python3}" \
  "${SMOKE:=1}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1

install() {
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$@"
}
smoke() {  # $1: which stack, for the file name
  echo "[accelerator_run] smoke run with the $1 stack"
  "$PYTHON" benchmarks/accelerator_check.py --toy --parts small/plain --budget_s 120 \
    --out "$OUT/smoke_$1.json" > /dev/null
}

shopt -s nullglob
wheels=(.whl/*.whl)
if ((${#wheels[@]})); then
  install "${wheels[@]}" || { echo "[accelerator_run] installing .whl/*.whl failed"; exit 1; }
fi
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
if [[ "$SMOKE" == 0 ]]; then
  echo "[accelerator_run] SMOKE=0: no smoke run; the image's stack as it is"
elif ! smoke image; then
  pinned=(.whl/pinned/*.whl)
  ((${#pinned[@]})) || { echo "[accelerator_run] smoke run failed and .whl/pinned/ is empty"
                         exit 1; }
  echo "[accelerator_run] the image's stack failed the smoke run ($OUT/smoke_image.json):" \
       "installing ${pinned[*]}"
  install "${pinned[@]}" && smoke pinned || {
    echo "[accelerator_run] the smoke run failed with both stacks: $OUT/smoke_*.json"; exit 1; }
fi
left=$((BUDGET_S - SECONDS))
echo "[accelerator_run] set up in ${SECONDS} s; the check gets ${left} s"
"$PYTHON" benchmarks/accelerator_check.py --budget_s "$left" "$@"
