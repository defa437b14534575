#!/bin/bash
# Downloads, into .whl/ of the checkout, the wheels that benchmarks/accelerator_check.py needs
# on a lent H100 / H200 and that its image lacks (it has JAX, Flax, optax, orbax, numpy, scipy,
# sentencepiece, hypothesis, pytest, ...; see /work/.library/device/KINDS.md): TFDS and its
# own needs, and ml_collections. That machine reaches no registry and runs Python 3.12 on
# x86-64, so the wheels are fetched here for that interpreter, without their dependencies
# (each needed one is named below). .whl/ is kept out of git (.git/info/exclude).
#
# Into .whl/pinned/ go the Flax, optax and orbax-checkpoint that this project's suite passes
# with, the versions python3 here has installed (run this in the project's virtual
# environment): the image's own versions are not known ahead, so
# benchmarks/accelerator_run.sh falls back on these when a smoke run fails with the image's.
# Their dependencies (msgpack, tensorstore, treescope, rich, aiofiles, humanize, ...) are in
# the image.
#
#     bash benchmarks/accelerator_wheels.sh
#
# benchmarks/accelerator_run.sh installs them there and runs the check.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PACKAGES=(
  tensorflow-datasets==4.9.10 ml-collections==1.1.0
  # tensorflow-datasets' needs that the image lacks:
  array-record==0.8.6 dm-tree==0.1.10 immutabledict==4.3.1 simple-parsing==0.1.9
  docstring-parser==0.18.0 tensorflow-metadata==1.21.0 googleapis-common-protos==1.76.0
  termcolor==3.3.0 toml==0.10.2
)
# Published as a source archive only (pure Python): built into a wheel here.
SOURCE_ONLY=(promise==2.3)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d .whl "${PACKAGES[@]}"
python3 -m pip wheel -q --no-deps -w .whl "${SOURCE_ONLY[@]}"
PINNED=()
for name in flax optax orbax-checkpoint; do
  version=$(python3 -c "import importlib.metadata as m; print(m.version('$name'))") || {
    echo "python3 has no $name installed: run this in the project's virtual environment" >&2
    exit 1; }
  PINNED+=("$name==$version")
done
rm -rf .whl/pinned
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform any -d .whl/pinned "${PINNED[@]}"
echo "pinned: ${PINNED[*]}"
du -sh .whl
