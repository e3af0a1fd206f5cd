#!/usr/bin/env bash
# Builds the libFuzzer targets and fuzzes the safetensors / .npy parsers, the GGUF reader and
# loader, and the tokenizers (text, ids and GGUF vocabularies) for a bounded time, the three
# fuzzers side by side.
#   FUZZ_PRESET   the preset that builds them: "fuzz" (default: their own build, build-fuzz/) or
#                 "asan" (inside the ASan + UBSan build, build-asan/, as CI does; fuzz/CMakeLists.txt)
#   FUZZ_SECONDS  the time per fuzzer (default 60)
#   FUZZ_JOBS     parallel fuzzing jobs per fuzzer (default 1)
# A crash leaves its input in <build>/fuzz-artifacts/ and makes this script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${FUZZ_PRESET:-fuzz}"
seconds="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-1}"
case "$preset" in
  fuzz | asan) build="build-$preset" ;;
  *) echo "fuzz.sh: FUZZ_PRESET='$preset' (accepted: fuzz, asan)" >&2; exit 2 ;;
esac

command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 1; }
if ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 &&
   ! ls /usr/lib/llvm-*/lib/clang/*/lib/*/libclang_rt.fuzzer*.a >/dev/null 2>&1; then
  echo "fuzz.sh: libFuzzer runtime not found (apt-get install libclang-rt-dev)" >&2
  exit 1
fi

cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --target safetensors_fuzz gguf_fuzz tokenizer_fuzz

work="$build/fuzz-work"
seeds="$work/seeds"
corpus="$work/corpus"
artifacts="$build/fuzz-artifacts"
mkdir -p "$seeds" "$corpus" "$artifacts"

# Seed 1: a valid safetensors file with one F32 tensor of 2 elements and metadata. The header is
# padded with spaces to a multiple of 8 bytes (88), then 8 data bytes (1.0f, 2.0f).
header='{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
header="$(printf '%-88s' "$header")"
{
  printf '\x58\x00\x00\x00\x00\x00\x00\x00'
  printf '%s' "$header"
  printf '\x00\x00\x80\x3f\x00\x00\x00\x40'
} > "$seeds/tiny.safetensors"
[ "$(wc -c < "$seeds/tiny.safetensors")" -eq 104 ] || { echo "fuzz.sh: bad safetensors seed" >&2; exit 1; }

# Seed 2: what numpy writes for np.arange(6, dtype='<f4').reshape(2, 3): magic, version 1.0,
# u16 header length 118, the dict padded with spaces and '\n' so the data starts at byte 128.
dict="{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
{
  printf '\x93NUMPY\x01\x00\x76\x00'
  printf '%-117s\n' "$dict"
  printf '\x00\x00\x00\x00\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\xa0\x40'
} > "$seeds/arange.npy"
[ "$(wc -c < "$seeds/arange.npy")" -eq 152 ] || { echo "fuzz.sh: bad npy seed" >&2; exit 1; }

# A valid MLX affine-quantized MoE block (written by the fuzzer itself), so mutations reach the
# quantized loader paths and the affine kernels.
# And a GPT-OSS block in MXFP4 as OpenAI ships it, for the MXFP4 loader and kernels.
MOEKIT_FUZZ_WRITE_SEED="$seeds/quantized_block.safetensors" \
  MOEKIT_FUZZ_WRITE_MXFP4_SEED="$seeds/mxfp4_block.safetensors" \
  MOEKIT_FUZZ_WRITE_FP8_SEED="$seeds/fp8_block.safetensors" \
  MOEKIT_FUZZ_WRITE_INT4_SEED="$seeds/int4_block.safetensors" "$build"/bin/safetensors_fuzz -runs=0 >/dev/null 2>&1
[ -s "$seeds/quantized_block.safetensors" ] || { echo "fuzz.sh: no quantized seed" >&2; exit 1; }
[ -s "$seeds/mxfp4_block.safetensors" ] || { echo "fuzz.sh: no mxfp4 seed" >&2; exit 1; }

# The GGUF reader and loader: valid blocks written by the fuzzer itself as seeds.
gguf_seeds="$work/gguf-seeds"
gguf_corpus="$work/gguf-corpus"
mkdir -p "$gguf_seeds" "$gguf_corpus"
MOEKIT_FUZZ_WRITE_GGUF_SEEDS="$gguf_seeds" "$build"/bin/gguf_fuzz -runs=0 >/dev/null 2>&1
[ -s "$gguf_seeds/qwen3moe.gguf" ] || { echo "fuzz.sh: no GGUF seed" >&2; exit 1; }

# The tokenizers: a text, ids and a vocabulary GGUF written by the fuzzer itself as seeds.
tok_seeds="$work/tokenizer-seeds"
tok_corpus="$work/tokenizer-corpus"
mkdir -p "$tok_seeds" "$tok_corpus"
MOEKIT_FUZZ_WRITE_TOKENIZER_SEEDS="$tok_seeds" "$build"/bin/tokenizer_fuzz -runs=0 >/dev/null 2>&1
[ -s "$tok_seeds/vocab.bin" ] || { echo "fuzz.sh: no tokenizer seed" >&2; exit 1; }

parallel=()
if [ "$jobs" -gt 1 ]; then parallel=(-fork="$jobs"); fi
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "fuzz.sh: fuzzing safetensors_fuzz, gguf_fuzz and tokenizer_fuzz for ${seconds}s each, side by side ($build)"
"$build"/bin/safetensors_fuzz -max_total_time="$seconds" -max_len=8192 -rss_limit_mb=2048 -timeout=10 \
  "${parallel[@]}" -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus" "$seeds" \
  >"$work/safetensors.log" 2>&1 &
safetensors=$!
"$build"/bin/gguf_fuzz -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  "${parallel[@]}" -artifact_prefix="$artifacts/gguf-" -print_final_stats=1 "$gguf_corpus" "$gguf_seeds" \
  >"$work/gguf.log" 2>&1 &
gguf=$!
"$build"/bin/tokenizer_fuzz -max_total_time="$seconds" -max_len=262144 -rss_limit_mb=2048 -timeout=10 \
  "${parallel[@]}" -artifact_prefix="$artifacts/tokenizer-" -print_final_stats=1 "$tok_corpus" "$tok_seeds" \
  >"$work/tokenizer.log" 2>&1 &
tokenizer=$!
failed=0
for name in safetensors gguf tokenizer; do
  rc=0
  wait "${!name}" || rc=$?
  echo "== fuzz.sh: ${name}_fuzz (exit $rc)"
  cat "$work/$name.log"
  ((rc == 0)) || failed=1
done
exit "$failed"
