// gemm_nt_bf16 (the bf16 compute mode's product) beyond matching its references on every path
// (the conformance table, conformance.hpp: the f32_fma path on every Highway target against
// gemm_nt on the rounded rows, avx512bf16 and amx, rows and amx_tiles, against their scalar
// twins bit for bit, each within the dot-product bound of the exact sum):
//  - denormal inputs and results flushed as the twins flush them (avx512bf16, amx);
//  - an AMX row's result does not depend on the other rows of its batch; any split over threads
//    gives the same bits;
//  - pack_amx_tiles and round_to_bf16 (every form, every target) lay out and round as gemm.hpp
//    and f32_to_bf16 say.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm.hpp"
#include "kernels/ref/gemm_ref.hpp"
#include "kernels/targets.hpp"
#include "moekit/threading.hpp"

namespace moekit {
namespace {

using kernels::Bf16Path;
using kernels::Bf16Rows;
using kernels::Output;
using kernels::WeightMatrix;

std::vector<std::uint16_t> random_bf16(std::int64_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<std::uint16_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = f32_to_bf16(d(rng));
  return v;
}

bool native() { return kernels::bf16_path_supported(Bf16Path::avx512bf16); }
bool amx() { return kernels::bf16_path_supported(Bf16Path::amx); }

// Scratch for round_to_bf16's output on `path` (floats, enough bytes).
std::vector<float> activation_buffer(std::int64_t rows, std::int64_t K, Bf16Path path) {
  return std::vector<float>((kernels::bf16_activation_bytes(rows, K, path) + 3) / 4 + 1);
}

struct Case {
  std::int64_t M, N, K;
  bool gather, row_scale, accumulate;
};

// Operands of one case: A gathered from 2M+1 rows of lda = K + 5, B [N, K] with ldb = K + 3.
struct Operands {
  std::int64_t lda, ldb, ldc;
  std::vector<std::uint16_t> a, b;
  std::vector<std::int32_t> index;
  std::vector<float> rs, c0;

  Operands(const Case& c, std::mt19937& rng, float scale = 1.0f)
      : lda(c.K + 5), ldb(c.K + 3), ldc(c.N + 2) {
    const std::int64_t src_rows = c.gather ? 2 * c.M + 1 : c.M;
    a = random_bf16(src_rows * lda, rng, scale);
    b = random_bf16(c.N * ldb, rng, scale);
    std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(src_rows - 1));
    for (std::int64_t i = 0; i < c.M; ++i) index.push_back(pick(rng));
    for (std::int64_t i = 0; i < c.M; ++i) rs.push_back(std::uniform_real_distribution<float>(0.25f, 2.0f)(rng));
    c0.resize(static_cast<std::size_t>(std::max<std::int64_t>(c.M, 1) * ldc));
    std::normal_distribution<float> d;
    for (auto& v : c0) v = d(rng);
  }
  Bf16Rows A(const Case& c) const { return {a.data(), lda, c.gather ? index.data() : nullptr}; }
  WeightMatrix B() const { return {b.data(), DType::bf16, ldb}; }
  Output C(const Case& c, std::vector<float>& out) const {
    out = c0;
    return {out.data(), ldc, c.row_scale ? rs.data() : nullptr, c.accumulate};
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::int64_t M : {1, 2, 5, 6, 7, 13})
    for (const std::int64_t N : {1, 3, 4, 9, 37})
      for (const std::int64_t K : {1, 2, 31, 32, 33, 95, 256})
        out.push_back({M, N, K, (M + N) % 2 == 0, K % 3 == 0, N % 2 == 1});
  out.push_back({64, 96, 2048, true, true, false});  // an expert task at the reference width
  // Several L2 blocks of weight rows (the kernel prefetches the next block while it computes),
  // with a K tail and odd row counts: 9 and 70 rows a block at K = 1509 and 2085.
  out.push_back({7, 301, 1509, true, false, true});
  out.push_back({13, 150, 2085, false, true, false});
  return out;
}

std::string name(const Case& c) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "M=%lld N=%lld K=%lld gather=%d row_scale=%d acc=%d", static_cast<long long>(c.M),
                static_cast<long long>(c.N), static_cast<long long>(c.K), c.gather, c.row_scale, c.accumulate);
  return buf;
}

// Bit patterns of the first N columns of M rows (and the padding columns, which must be untouched).
void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    std::uint32_t g, w;
    std::memcpy(&g, &got[i], 4);
    std::memcpy(&w, &want[i], 4);
    if (g != w) {
      ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
      return;
    }
  }
}

TEST(GemmBf16, PathIsNamed) {
  const Bf16Path p = kernels::bf16_path();
  std::printf("[ bf16 path ] the bf16 compute mode runs %s on this CPU (avx512bf16 %s; amx %s)\n",
              kernels::bf16_path_name(p), native() ? "supported" : "not supported: that path is skipped",
              amx() ? "supported" : "not supported: that path is skipped");
  EXPECT_TRUE(kernels::bf16_path_supported(p));
}

// vdpbf16ps reads denormal inputs as zero and flushes denormal results: tiny operands whose
// products and sums underflow, and bf16 denormals themselves, must still match the twin.
TEST(GemmBf16, NativeFlushesDenormalsAsItsTwin) {
  if (!native()) GTEST_SKIP() << "this CPU has no AVX512-BF16: the vdpbf16ps path was not run";
  std::mt19937 rng(12);
  const Case c{5, 9, 70, false, false, false};
  Operands op(c, rng, 1e-19f);  // products ~1e-38: around FLT_MIN
  for (std::size_t i = 0; i < op.a.size(); i += 7) op.a[i] = static_cast<std::uint16_t>(0x0001u + (i % 0x7f));
  for (std::size_t i = 3; i < op.b.size(); i += 11) op.b[i] = 0x8003u;  // negative denormal
  std::vector<float> got, want;
  kernels::detail::gemm_nt_bf16_avx512(op.A(c), op.B(), op.C(c, got), c.M, c.N, c.K);
  kernels::ref::gemm_nt_bf16_dpbf16(op.A(c), op.B(), op.C(c, want), c.M, c.N, c.K);
  expect_bitwise(got, want);
  // And the flushing really happened: some products were denormal.
  int flushed = 0;
  for (std::int64_t k = 0; k < c.K; ++k) {
    const float p = bf16_to_f32(op.a[k]) * bf16_to_f32(op.b[k]);
    flushed += std::fpclassify(p) == FP_SUBNORMAL || std::fpclassify(bf16_to_f32(op.a[k])) == FP_SUBNORMAL;
  }
  EXPECT_GT(flushed, 0);
}

// The bf16 values of `op`'s A as f32 rows (round_to_bf16 leaves them unchanged), for the AMX form.
std::vector<float> widened(const Operands& op) {
  std::vector<float> a32(op.a.size());
  for (std::size_t i = 0; i < a32.size(); ++i) a32[i] = bf16_to_f32(op.a[i]);
  return a32;
}

// The AMX kernel (through the driver, which splits in panels and tile pairs) against the twin,
// the weights in rows and in amx_tiles.
void expect_amx_matches_twin(const Case& c, const Operands& op) {
  const std::vector<float> a32 = widened(op);
  std::vector<float> buf = activation_buffer(c.M, c.K, Bf16Path::amx);
  const kernels::RowSource x{a32.data(), op.lda, c.gather ? op.index.data() : nullptr};
  const kernels::Bf16Activations A = kernels::round_to_bf16(x, c.M, c.K, Bf16Path::amx, buf.data());
  std::vector<float> got, want;
  kernels::gemm_nt_bf16(A, op.B(), op.C(c, got), c.M, c.N, c.K);
  kernels::ref::gemm_nt_bf16_tdpbf16(op.A(c), op.B(), op.C(c, want), c.M, c.N, c.K);
  expect_bitwise(got, want);
  // The same weights packed in AMX tiles.
  std::vector<std::uint16_t> tiles(static_cast<std::size_t>(kernels::amx_tile_elements(c.N, c.K)));
  kernels::pack_amx_tiles(op.B(), c.N, c.K, tiles.data());
  std::vector<float> packed_got;
  kernels::gemm_nt_bf16(A, {tiles.data(), DType::bf16, 0, kernels::WeightLayout::amx_tiles},
                        op.C(c, packed_got), c.M, c.N, c.K);
  SCOPED_TRACE("amx_tiles");
  expect_bitwise(packed_got, want);
}

std::vector<Case> amx_cases() {
  std::vector<Case> out = cases();
  for (const std::int64_t M : {15, 16, 17, 32, 33, 50})  // partial, whole and odd panel counts
    for (const std::int64_t N : {16, 31, 32, 47, 70})
      for (const std::int64_t K : {32, 63, 160})
        out.push_back({M, N, K, (M + N) % 2 == 1, K % 3 == 0, N % 2 == 0});
  return out;
}

// pack_amx_tiles (plain C++: checked on every CPU) puts element (n, k) where
// weight_offset(amx_tiles) says, whole 1 KB tiles, zero past N and K.
TEST(GemmBf16, AmxTilesHoldTheRowsWhereGemmHppSays) {
  std::mt19937 rng(21);
  for (const Case& c : amx_cases()) {
    SCOPED_TRACE(name(c));
    const Operands op(c, rng);
    std::vector<std::uint16_t> tiles(static_cast<std::size_t>(kernels::amx_tile_elements(c.N, c.K)), 0xFFFFu);
    kernels::pack_amx_tiles(op.B(), c.N, c.K, tiles.data());
    ASSERT_EQ(static_cast<std::int64_t>(tiles.size()), (c.N + 15) / 16 * 16 * kernels::amx_padded_k(c.K));
    std::size_t nonzero_padding = 0;
    for (std::int64_t n = 0; n < (c.N + 15) / 16 * 16; ++n)
      for (std::int64_t k = 0; k < kernels::amx_padded_k(c.K); ++k) {
        const std::uint16_t v = tiles[static_cast<std::size_t>(
            kernels::weight_offset(kernels::WeightLayout::amx_tiles, n, k, c.K, 0))];
        if (n < c.N && k < c.K) {
          ASSERT_EQ(v, op.b[static_cast<std::size_t>(n * op.ldb + k)]) << "tile element " << n << ", " << k;
        } else {
          nonzero_padding += v != 0;
        }
      }
    EXPECT_EQ(nonzero_padding, 0u);
  }
}

// tdpbf16ps reads denormal inputs as zero and flushes denormal products, sums and results.
TEST(GemmBf16, AmxFlushesDenormalsAsItsTwin) {
  if (!amx()) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16: the tdpbf16ps path was not run";
  std::mt19937 rng(22);
  for (const Case& c : {Case{5, 9, 70, false, false, false}, Case{20, 40, 96, true, true, true}}) {
    SCOPED_TRACE(name(c));
    Operands op(c, rng, 1e-19f);  // products ~1e-38: around FLT_MIN
    for (std::size_t i = 0; i < op.a.size(); i += 7) op.a[i] = static_cast<std::uint16_t>(0x0001u + (i % 0x7f));
    for (std::size_t i = 3; i < op.b.size(); i += 11) op.b[i] = 0x8003u;  // negative denormal
    for (std::size_t i = 5; i < op.b.size(); i += 13) op.b[i] = 0x8000u;  // negative zero
    expect_amx_matches_twin(c, op);
  }
}

// A row's result is the same whatever else shares its call: alone, or in a batch of 50.
TEST(GemmBf16, AmxRowDoesNotDependOnTheBatch) {
  if (!amx()) GTEST_SKIP() << "this CPU (or OS) has no AMX-BF16: the tdpbf16ps path was not run";
  std::mt19937 rng(23);
  const Case c{50, 45, 200, false, false, false};
  const Operands op(c, rng);
  const std::vector<float> a32 = widened(op);
  std::vector<float> buf = activation_buffer(c.M, c.K, Bf16Path::amx);
  const kernels::Bf16Activations all =
      kernels::round_to_bf16({a32.data(), op.lda}, c.M, c.K, Bf16Path::amx, buf.data());
  std::vector<float> batch;
  kernels::gemm_nt_bf16(all, op.B(), op.C(c, batch), c.M, c.N, c.K);
  for (const std::int64_t m : {0, 17, 49}) {
    std::vector<float> one_buf = activation_buffer(1, c.K, Bf16Path::amx);
    const kernels::Bf16Activations one = kernels::round_to_bf16({a32.data() + m * op.lda, op.lda}, 1, c.K,
                                                                Bf16Path::amx, one_buf.data());
    std::vector<float> alone(static_cast<std::size_t>(c.N));
    kernels::gemm_nt_bf16(one, op.B(), {alone.data(), c.N}, 1, c.N, c.K);
    for (std::int64_t n = 0; n < c.N; ++n) {
      std::uint32_t g, w;
      std::memcpy(&g, &alone[n], 4);
      std::memcpy(&w, &batch[m * op.ldc + n], 4);
      ASSERT_EQ(g, w) << "row " << m << " column " << n;
    }
  }
}

TEST(GemmBf16, AnyThreadCountGivesTheSameBits) {
  std::mt19937 rng(15);
  const int before = num_threads();
  for (const Bf16Path path : kernels::kBf16Paths) {
    if (!kernels::bf16_path_supported(path)) continue;
    SCOPED_TRACE(kernels::bf16_path_name(path));
    for (const Case& c : {Case{3, 700, 512, false, true, false}, Case{200, 64, 256, false, false, true},
                          Case{70, 90, 100, false, true, true}}) {
      SCOPED_TRACE(name(c));
      const Operands op(c, rng);
      std::vector<float> a32(op.a.size());
      for (std::size_t i = 0; i < a32.size(); ++i) a32[i] = bf16_to_f32(op.a[i]);
      std::vector<float> buf = activation_buffer(c.M, c.K, path);
      const kernels::Bf16Activations A = kernels::round_to_bf16({a32.data(), op.lda}, c.M, c.K, path, buf.data());
      std::vector<float> base;
      kernels::gemm_nt_bf16(A, op.B(), op.C(c, base), c.M, c.N, c.K, kernels::Threads::caller);
      for (const int t : {1, 2, 3, 5}) {
        set_num_threads(t);
        std::vector<float> got;
        kernels::gemm_nt_bf16(A, op.B(), op.C(c, got), c.M, c.N, c.K);
        expect_bitwise(got, base);
      }
    }
  }
  set_num_threads(before);
}

// FP8 weights (e4m3 with block scales, as released) in the bf16 compute mode: on every path the
// bits of the same path on the bf16 matrix that decoding with decode_dtype bf16 gives (a weight
// decoded as the reference decodes it, rounded to bf16), on 1 and 3 threads — 128 x 128 blocks
// with ragged edges, a thread's share starting inside a block, rows of several decoded blocks.
TEST(GemmBf16, Fp8WeightsAreTheirBf16RoundedDecode) {
  std::mt19937 rng(21);
  const int before = num_threads();
  for (const moekit::WeightFormat f :
       {moekit::WeightFormat::fp8(128, 128, DType::f32), moekit::WeightFormat::fp8(1, 200, DType::bf16)}) {
    const std::int64_t N = 150, K = 200;
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(N * K));
    for (auto& b : codes) {
      b = static_cast<std::uint8_t>(rng());
      if ((b & 0x7F) == 0x7F) b ^= 1;  // e4m3's NaNs made numbers
    }
    const std::int64_t srows = (N + f.block_rows - 1) / f.block_rows, scols = (K + f.block_cols - 1) / f.block_cols;
    std::vector<float> s32(static_cast<std::size_t>(srows * scols));
    std::vector<std::uint16_t> s16(s32.size());
    for (std::size_t i = 0; i < s32.size(); ++i) {
      s32[i] = std::ldexp(1.0f + static_cast<float>(rng() % 256) / 256.0f, -7 - static_cast<int>(rng() % 3));
      s16[i] = f32_to_bf16(s32[i]);
    }
    WeightMatrix q{codes.data(), DType::u8, K};
    q.format = f;
    q.scales = f.scale_dtype == DType::f32 ? static_cast<const void*>(s32.data()) : s16.data();
    q.scale_ld = scols;
    WeightMatrix r = q;
    r.format.decode_dtype = DType::bf16;
    std::vector<float> decoded(static_cast<std::size_t>(N * K));
    kernels::dequantize_rows(r, 0, N, K, decoded.data());
    std::vector<std::uint16_t> wb(decoded.size());
    for (std::size_t i = 0; i < wb.size(); ++i) {
      wb[i] = f32_to_bf16(decoded[i]);
      ASSERT_EQ(bf16_to_f32(wb[i]), decoded[i]) << "decode_dtype bf16 gives bf16 values";
    }
    const WeightMatrix dense{wb.data(), DType::bf16, K};
    for (const Bf16Path path : kernels::kBf16Paths) {
      if (!kernels::bf16_path_supported(path)) continue;
      SCOPED_TRACE(kernels::bf16_path_name(path));
      for (const std::int64_t M : {1, 5, 40}) {
        std::vector<float> x(static_cast<std::size_t>(M * K));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : x) v = nd(rng);
        std::vector<float> buf = activation_buffer(M, K, path);
        const kernels::Bf16Activations A = kernels::round_to_bf16({x.data(), K}, M, K, path, buf.data());
        std::vector<float> want(static_cast<std::size_t>(M * N)), got(want.size());
        kernels::gemm_nt_bf16(A, dense, {want.data(), N}, M, N, K, kernels::Threads::caller);
        for (const int t : {1, 3}) {
          set_num_threads(t);
          std::fill(got.begin(), got.end(), -1.0f);
          kernels::gemm_nt_bf16(A, q, {got.data(), N}, M, N, K);
          expect_bitwise(got, want);
        }
      }
    }
  }
  set_num_threads(before);
}

TEST(GemmBf16, RoundToBf16MatchesTheScalarConversionOnEveryTarget) {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, 1.00390625f /* tie, even */, 1.01171875f /* tie, odd */,
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min(), 3.4e38f /* rounds to Inf */, -1e-41f};
  std::mt19937 rng(16);
  std::normal_distribution<float> d;
  while (v.size() < 67) v.push_back(d(rng));  // 67: a tail past every vector width
  const std::int64_t K = 67;
  std::vector<float> src = v;
  src.insert(src.end(), v.rbegin(), v.rend());  // two rows
  const std::vector<std::int32_t> index = {1, 0};
  const std::vector<float> scale = {0.5f, 3.0f};
  const kernels::RowSource A{src.data(), K, index.data(), scale.data()};
  testing::for_each_target([&](std::int64_t) {
    std::vector<std::uint16_t> out16(kernels::bf16_activation_bytes(2, K, Bf16Path::avx512bf16) / 2);
    std::vector<float> out32(kernels::bf16_activation_bytes(2, K, Bf16Path::f32_fma) / 4);
    // The bf16 form (any CPU), rows a padded stride apart; and the f32 form.
    const std::int64_t ld16 = kernels::round_to_bf16(A, 2, K, Bf16Path::avx512bf16, out16.data()).ld;
    const std::int64_t ld32 = kernels::round_to_bf16(A, 2, K, Bf16Path::f32_fma, out32.data()).ld;
    ASSERT_EQ(ld16, kernels::bf16_activation_ld(K, Bf16Path::avx512bf16));
    ASSERT_EQ(ld32, kernels::bf16_activation_ld(K, Bf16Path::f32_fma));
    ASSERT_GE(ld16, K);
    ASSERT_GE(ld32, K);
    std::vector<std::uint16_t> packed(kernels::bf16_activation_bytes(2, K, Bf16Path::amx) / 2, 0xFFFFu);
    const kernels::Bf16Activations amx_form = kernels::round_to_bf16(A, 2, K, Bf16Path::amx, packed.data());
    const std::int64_t Kp = kernels::amx_padded_k(K);
    ASSERT_EQ(amx_form.ld, Kp);
    ASSERT_EQ(static_cast<std::int64_t>(packed.size()), 16 * Kp);  // one panel
    for (std::int64_t m = 0; m < 16; ++m)
      for (std::int64_t k = 0; k < Kp; ++k) {
        const std::uint16_t got = packed[static_cast<std::size_t>((k / 2) * 32 + m * 2 + k % 2)];
        const std::uint16_t want = m < 2 && k < K ? out16[static_cast<std::size_t>(m * ld16 + k)] : 0;
        ASSERT_EQ(got, want) << "amx form, row " << m << " k " << k;
      }
    for (std::int64_t i = 0; i < 2; ++i)
      for (std::int64_t k = 0; k < K; ++k) {
        const float x = src[static_cast<std::size_t>(index[i] * K + k)] * scale[i];
        const std::uint16_t want = f32_to_bf16(x);
        std::uint32_t bits32;
        std::memcpy(&bits32, &out32[static_cast<std::size_t>(i * ld32 + k)], 4);
        EXPECT_EQ(out16[static_cast<std::size_t>(i * ld16 + k)], want) << "row " << i << " k " << k << " x " << x;
        EXPECT_EQ(bits32, static_cast<std::uint32_t>(want) << 16) << "row " << i << " k " << k << " x " << x;
      }
  });
}

// The AMX form over several panels (the last one partial) and chunks of 32 (K past a chunk, odd
// K): every element where gemm.hpp places it, rounded as f32_to_bf16, zero past the rows and K.
TEST(GemmBf16, RoundToBf16AmxFormOverPanelsAndChunks) {
  std::mt19937 rng(17);
  std::normal_distribution<float> d(0.0f, 3.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -0.0f, std::numeric_limits<float>::infinity(),
                            1.00390625f, 1.01171875f, std::numeric_limits<float>::denorm_min(), 1.1754942e-38f};
  for (const std::int64_t K : {1, 31, 32, 33, 95, 130}) {
    for (const std::int64_t rows : {1, 16, 37}) {
      SCOPED_TRACE(::testing::Message() << "K " << K << ", rows " << rows);
      const std::int64_t src_rows = 2 * rows + 1, ld = K + 3;
      std::vector<float> src(static_cast<std::size_t>(src_rows * ld));
      for (std::size_t i = 0; i < src.size(); ++i) src[i] = i % 5 == 0 ? specials[i / 5 % 7] : d(rng);
      std::vector<std::int32_t> index;
      std::vector<float> scale;
      for (std::int64_t i = 0; i < rows; ++i) {
        index.push_back(static_cast<std::int32_t>((i * 7 + 3) % src_rows));
        scale.push_back(std::uniform_real_distribution<float>(0.25f, 2.0f)(rng));
      }
      for (const bool scaled : {false, true}) {
        const kernels::RowSource A{src.data(), ld, index.data(), scaled ? scale.data() : nullptr};
        std::vector<std::uint16_t> packed(kernels::bf16_activation_bytes(rows, K, Bf16Path::amx) / 2, 0xABCDu);
        kernels::round_to_bf16(A, rows, K, Bf16Path::amx, packed.data());
        const std::int64_t Kp = kernels::amx_padded_k(K), panels = (rows + 15) / 16;
        ASSERT_EQ(static_cast<std::int64_t>(packed.size()), panels * 16 * Kp);
        for (std::int64_t m = 0; m < panels * 16; ++m)
          for (std::int64_t k = 0; k < Kp; ++k) {
            const std::uint16_t got = packed[static_cast<std::size_t>((m / 16) * 16 * Kp + (k / 2) * 32 + (m % 16) * 2 + k % 2)];
            std::uint16_t want = 0;
            if (m < rows && k < K) {
              const float x = src[static_cast<std::size_t>(index[m] * ld + k)];
              want = f32_to_bf16(scaled ? x * scale[m] : x);
            }
            ASSERT_EQ(got, want) << "row " << m << " k " << k << (scaled ? " scaled" : "");
          }
      }
    }
  }
}

}  // namespace
}  // namespace moekit
