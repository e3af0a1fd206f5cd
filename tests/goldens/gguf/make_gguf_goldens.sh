#!/usr/bin/env bash
# Regenerates tests/goldens/gguf/ (see make_gguf_goldens.py): fetches the llama.cpp tree inside
# PyPI's llama-cpp-python source distribution (LLAMA_CPP_PYTHON_VERSION, default 0.3.36) into
# build-peers/ggml/, builds its libggml-base with -ffp-contract=off into build-peers/ggml-ref/, and
# runs the generator with llama.cpp's own gguf-py. PYTHON: an interpreter with numpy (default python3).
set -euo pipefail
cd "$(dirname "$0")/../../.."
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
python="${PYTHON:-python3}"
dir=build-peers/ggml
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
mkdir -p "$dir"
if [[ ! -f "$src/ggml/src/ggml-quants.c" ]]; then
  url="$(curl -fsSL "https://pypi.org/simple/llama-cpp-python/" |
         grep -o "https://[^\"#]*llama_cpp_python-$version.tar.gz" | head -n1)"
  [[ -n "$url" ]] || { echo "make_gguf_goldens.sh: no sdist of llama-cpp-python $version on PyPI" >&2; exit 1; }
  curl -fsSL -o "$dir/llama_cpp_python-$version.tar.gz" "$url"
  tar xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
fi
if [[ ! -f build-peers/ggml-ref/bin/libggml-base.so ]]; then
  cmake -S "$src" -B build-peers/ggml-ref -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DCMAKE_C_FLAGS=-ffp-contract=off -DCMAKE_CXX_FLAGS=-ffp-contract=off
  cmake --build build-peers/ggml-ref --target ggml-base
fi
"$python" -W ignore tests/goldens/gguf/make_gguf_goldens.py --ggml build-peers/ggml-ref/bin/libggml-base.so \
  --gguf-py "$src/gguf-py" --out tests/goldens/gguf
