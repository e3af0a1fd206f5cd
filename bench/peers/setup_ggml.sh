#!/usr/bin/env bash
# Builds ggml's test-backend-ops from the llama.cpp sources vendored in PyPI's llama-cpp-python
# source distribution, under build-peers/ggml/; `setup_ggml.sh decode` builds instead only the ggml
# libraries and bench/peers/ggml_decode.cpp against them (build-peers/ggml/ggml_decode, the fair
# decode harness of decode.sh); `setup_ggml.sh decode-avx2` the same with ggml built for AVX2 + FMA
# alone (build-peers/ggml/ggml_decode_avx2: an AVX2-only CPU's ggml, for moekit run with
# MOEKIT_INT8_PATH=avx2 on the same machine). Idempotent: prints nothing when the binary is there.
# On success prints nothing on stdout; on failure prints one line "not measured: <reason>" on
# stdout and exits 1 (run.sh puts that line in the table).
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), PEERS_DIR.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$ROOT/build-peers}"
DIR="$PEERS_DIR/ggml"
WANT_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
BIN_LINK="$DIR/test-backend-ops"
MODE="${1:-test-backend-ops}"
[[ $MODE == decode ]] && BIN_LINK="$DIR/ggml_decode"
[[ $MODE == decode-avx2 ]] && BIN_LINK="$DIR/ggml_decode_avx2"
[[ $MODE == decode || $MODE == decode-avx2 || $MODE == test-backend-ops ]] ||
    { echo "setup_ggml.sh: unknown mode '$MODE'" >&2; exit 2; }
mkdir -p "$DIR"

log() { echo "peers/ggml: $*" >&2; }
fail() { log "$*"; echo "not measured: $*"; exit 1; }

# (the harness is rebuilt when its source is newer than it)
[[ -x "$BIN_LINK" && -f "$DIR/VERSION" && ! ( $MODE == decode* && "$ROOT/bench/peers/ggml_decode.cpp" -nt "$BIN_LINK" ) ]] && exit 0

# 1. The source distribution (the exact version, else the newest PyPI has; VERSION records which).
sdist="$(ls "$DIR"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)"
if [[ -z "$sdist" ]]; then
    log "downloading llama-cpp-python==$WANT_VERSION source distribution from PyPI"
    if ! nice -n 19 python3 -m pip download -q --no-binary :all: --no-deps \
            "llama-cpp-python==$WANT_VERSION" -d "$DIR" >&2; then
        log "llama-cpp-python==$WANT_VERSION not available; trying the newest"
        nice -n 19 python3 -m pip download -q --no-binary :all: --no-deps llama-cpp-python -d "$DIR" >&2 ||
            fail "pip download of the llama-cpp-python sdist failed"
    fi
    sdist="$(ls "$DIR"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)"
    [[ -n "$sdist" ]] || fail "no llama-cpp-python sdist after pip download"
fi
version="$(basename "$sdist" .tar.gz)"; version="${version#llama_cpp_python-}"
src="$DIR/llama_cpp_python-$version/vendor/llama.cpp"
if [[ ! -f "$src/tests/test-backend-ops.cpp" ]]; then
    log "unpacking $(basename "$sdist")"
    nice -n 19 tar xzf "$sdist" -C "$DIR" || fail "cannot unpack $sdist"
    [[ -f "$src/tests/test-backend-ops.cpp" ]] || fail "no vendor/llama.cpp/tests/test-backend-ops.cpp in $sdist"
fi

# 2. A small patch to the unpacked copy (never to moekit). Stock test-backend-ops
#  - sets the CPU backend to hardware_concurrency()/2 threads, with no option to change it: on a
#    2-core machine that is 1 thread. MOEKIT_PEERS_THREADS sets the count instead.
#  - in perf mode runs a fixed list of cases: MUL_MAT_ID at the Qwen3 shape only, without bf16.
#    MOEKIT_PEERS_MMID="type:n_mats:n_used:m:n:k;..." replaces that list by these cases, built with
#    test-backend-ops' own test_mul_mat_id (same timing loop, same routing redraw).
# The patch is applied once, marked by MOEKIT_PEERS_PATCH; each step checks its anchor matched.
tbo="$src/tests/test-backend-ops.cpp"
if ! grep -q MOEKIT_PEERS_PATCH "$tbo"; then
    log "patching test-backend-ops.cpp (thread count, extra MUL_MAT_ID perf cases)"
    python3 - "$tbo" <<'PY' || fail "test-backend-ops.cpp of llama-cpp-python $version does not match the patch anchors"
import sys
path = sys.argv[1]
text = open(path).read()
threads_anchor = "ggml_backend_set_n_threads_fn(backend.get(), std::max<int>(1, N_THREADS/2));"
perf_anchor = "static std::vector<std::unique_ptr<test_case>> make_test_cases_perf() {\n    std::vector<std::unique_ptr<test_case>> test_cases;\n"
for anchor in (threads_anchor, perf_anchor):
    if text.count(anchor) != 1:
        sys.exit("anchor not found once: " + anchor.splitlines()[0])
helpers = r'''
// MOEKIT_PEERS_PATCH (moekit bench/peers): the thread count and the MUL_MAT_ID perf cases from the environment.
static int moekit_peers_n_threads() {
    const char * s = getenv("MOEKIT_PEERS_THREADS");
    return (s && atoi(s) > 0) ? atoi(s) : std::max<int>(1, N_THREADS/2);
}
static bool moekit_peers_mmid_cases(std::vector<std::unique_ptr<test_case>> & cases) {
    const char * s = getenv("MOEKIT_PEERS_MMID");
    if (s == nullptr) {
        return false;
    }
    std::stringstream all(s);
    std::string item;
    while (std::getline(all, item, ';')) {
        char name[32];
        int n_mats = 0, n_used = 0;
        long long m = 0, n = 0, k = 0;
        if (sscanf(item.c_str(), "%31[^:]:%d:%d:%lld:%lld:%lld", name, &n_mats, &n_used, &m, &n, &k) != 6) {
            fprintf(stderr, "MOEKIT_PEERS_MMID: bad case '%s'\n", item.c_str());
            exit(1);
        }
        int type = -1;
        for (int i = 0; i < GGML_TYPE_COUNT; i++) {
            const char * tn = ggml_type_name((ggml_type) i);
            if (tn != nullptr && strcmp(tn, name) == 0) {
                type = i;
            }
        }
        if (type < 0) {
            fprintf(stderr, "MOEKIT_PEERS_MMID: unknown type '%s'\n", name);
            exit(1);
        }
        cases.emplace_back(new test_mul_mat_id((ggml_type) type, GGML_TYPE_F32, n_mats, n_used, false, m, n, k));
    }
    return true;
}

'''
text = text.replace(threads_anchor, "ggml_backend_set_n_threads_fn(backend.get(), moekit_peers_n_threads());")
text = text.replace(perf_anchor, helpers + perf_anchor +
                    "    if (moekit_peers_mmid_cases(test_cases)) {\n        return test_cases;\n    }\n")
open(path, "w").write(text)
PY
fi

# 3. Configure and build only test-backend-ops (it links libllama and llama-common, so those build
#    too; tools, examples, server and HTTPS are off). nice: the machine is shared.
bdir="$DIR/build-$version"
isa=(-DGGML_NATIVE=ON)
if [[ $MODE == decode-avx2 ]]; then
    bdir="$DIR/build-avx2-$version"
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF)
fi
command -v cmake >/dev/null && command -v ninja >/dev/null || fail "cmake and ninja are needed (apt-get install cmake ninja-build)"
if [[ ! -f "$bdir/build.ninja" ]]; then
    nice -n 19 cmake -S "$src" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
        -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
        >"$DIR/cmake-configure.log" 2>&1 || fail "cmake configure failed (see $DIR/cmake-configure.log)"
fi
if [[ $MODE == decode* ]]; then
    # The decode harness needs only ggml (ggml-base + ggml-cpu, OpenMP as llama.cpp builds it).
    log "building ggml of llama-cpp-python $version and the decode harness (a few minutes)"
    nice -n 19 cmake --build "$bdir" --target ggml -j "${PEERS_BUILD_JOBS:-2}" \
        >"$DIR/cmake-build-ggml.log" 2>&1 || fail "build of ggml failed (see $DIR/cmake-build-ggml.log)"
    libs=("$bdir/ggml/src/libggml.a" "$bdir/ggml/src/libggml-cpu.a" "$bdir/ggml/src/libggml-base.a")
    for l in "${libs[@]}"; do [[ -f $l ]] || fail "no $l after the ggml build"; done
    g++ -O2 -std=c++17 -I "$src/ggml/include" "$ROOT/bench/peers/ggml_decode.cpp" "${libs[@]}" \
        -fopenmp -lpthread -ldl -o "$BIN_LINK" 2>"$DIR/ggml_decode-build.log" ||
        fail "build of ggml_decode failed (see $DIR/ggml_decode-build.log)"
    echo "$version" > "$DIR/VERSION"
    log "ggml_decode ready ($version)"
    exit 0
fi
log "building test-backend-ops of llama.cpp from llama-cpp-python $version (Release, GGML_NATIVE; minutes)"
nice -n 19 cmake --build "$bdir" --target test-backend-ops -j "${PEERS_BUILD_JOBS:-2}" \
    >"$DIR/cmake-build.log" 2>&1 || fail "build of test-backend-ops failed (see $DIR/cmake-build.log)"
bin="$(find "$bdir" -type f -name test-backend-ops -perm -u+x | head -n1)"
[[ -n "$bin" ]] || fail "test-backend-ops not found under $bdir after the build"
ln -sf "$bin" "$BIN_LINK"
echo "$version" > "$DIR/VERSION"
log "test-backend-ops ready ($version)"
