#!/usr/bin/env bash
# Regenerates tests/goldens/models/ (see make_model_goldens.py and README.md). CI never runs this:
# the tests read the checked-in files only.
#
# Needs: python3 with venv, network access to PyPI. Makes build-peers/models-venv (torch,
# transformers, safetensors, numpy, sentencepiece, jinja2) unless PYTHON names an interpreter that
# has them, and fetches the llama.cpp tree inside PyPI's llama-cpp-python source distribution
# (LLAMA_CPP_PYTHON_VERSION, default 0.3.36) into build-peers/ggml/, whose convert_hf_to_gguf.py
# machinery (conversion/) and gguf-py the generator runs in-process.
#
# Versions of the checked-in files: transformers 5.25.0, torch 2.15.0+cu132 (run on CPU), numpy 2.4.6, the
# llama.cpp tree of llama-cpp-python 0.3.36 with its own gguf-py. Other transformers versions may
# change the saved config.json or the models' code (and so the references).
#
#   tests/goldens/models/make_model_goldens.sh                 # every family
#   tests/goldens/models/make_model_goldens.sh --only gpt-oss  # one (comma-separated list)
#   tests/goldens/models/make_model_goldens.sh --facts         # the GGUF keys/tensors README lists
set -euo pipefail
cd "$(dirname "$0")/../../.."
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
dir=build-peers/ggml
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
mkdir -p "$dir"
if [[ ! -f "$src/conversion/base.py" ]]; then
  url="$(curl -fsSL "https://pypi.org/simple/llama-cpp-python/" |
         grep -o "https://[^\"#]*llama_cpp_python-$version.tar.gz" | head -n1)"
  [[ -n "$url" ]] || { echo "make_model_goldens.sh: no sdist of llama-cpp-python $version on PyPI" >&2; exit 1; }
  curl -fsSL -o "$dir/llama_cpp_python-$version.tar.gz" "$url"
  tar xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
fi
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  python=build-peers/models-venv/bin/python
  if [[ ! -x "$python" ]]; then
    python3 -m venv build-peers/models-venv
    "$python" -m pip install -q --extra-index-url https://download.pytorch.org/whl/cpu \
      torch "transformers==5.25.0" safetensors numpy sentencepiece jinja2
  fi
fi
"$python" -W ignore tests/goldens/models/make_model_goldens.py --llama-cpp "$src" "$@"
