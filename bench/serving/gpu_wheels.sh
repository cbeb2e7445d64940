#!/usr/bin/env bash
# The pure-Python (and two binary) wheels sluice imports that the lent GPU machine's image lacks,
# downloaded here into .whl/ (git-ignored through .git/info/exclude, never committed) for
# bench/serving/gpu_session.py, which installs them there into a scratch folder. Run once, in the repo
# root, on a machine that reaches the package index:
#
#     bash bench/serving/gpu_wheels.sh
#
# Why these: `sluice.config` (imported by the engine) needs pydantic and pydantic-settings, which
# the machine's image does not list; pydantic 2.14 needs typing_extensions >= 4.16. Versions are
# the ones this project's environment runs; one version of each (two stop the install there).
# Everything else sluice imports for these checks (torch, transformers, tokenizers, safetensors,
# jinja2, tqdm, numpy, httpx and hypothesis for tests/conftest.py, pytest, pytest-timeout) is in
# the image; gguf and llguidance are imported only when a GGUF file or a grammar is used.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4 \
    annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0
ls -la .whl
