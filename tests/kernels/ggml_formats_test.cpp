// ggml's block types (kernels/formats/ggml_*.hpp) against ggml itself: tests/goldens/gguf/
// blocks.gguf holds, for each type, rows that ggml's C quantizer wrote and rows of random bytes,
// each with ggml's own dequantization (make_gguf_goldens.py). Every decode path must give those
// values bit for bit: the format table's scalar decode, the kernels' dequantize_rows (on x86 the
// vector decode, at each width the CPU has), and a GEMM against an identity, whose outputs are
// the weights themselves.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/formats/table.hpp"
#include "kernels/gemm.hpp"
#include "kernels/ggml_blocks.hpp"
#include "moekit/gguf.hpp"

namespace moekit {
namespace {

struct GgmlType {
  const char* name;
  Element element;
};

constexpr GgmlType kTypes[] = {
    {"q4_0", Element::q4_0},        {"q4_1", Element::q4_1}, {"q5_0", Element::q5_0},     {"q5_1", Element::q5_1},
    {"q8_0", Element::q8_0},        {"q2_K", Element::q2_k}, {"q3_K", Element::q3_k},     {"q4_K", Element::q4_k},
    {"q5_K", Element::q5_k},        {"q6_K", Element::q6_k}, {"iq4_nl", Element::iq4_nl}, {"iq4_xs", Element::iq4_xs},
    {"mxfp4", Element::ggml_mxfp4},
};

const GgufFile& blocks() { return testing::ggml_blocks(); }
using testing::same_bits;

class GgmlBlocks : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgmlBlocks, DecodeAsGgmlDoes) {
  const GgmlType& type = GetParam();
  for (const char* which : {".q", ".rand"}) {
    const std::string name = std::string(type.name) + which;
    const GgufTensorInfo* q = blocks().find(name);
    const GgufTensorInfo* ref = blocks().find(name + ".ref");
    ASSERT_TRUE(q && ref) << name;
    ASSERT_STREQ(ggml_type_info(q->type)->name, type.name);
    const std::int64_t K = q->ne[0], N = q->ne[1];
    ASSERT_EQ(ref->ne, q->ne);
    const auto* want = reinterpret_cast<const float*>(ref->data);

    kernels::WeightMatrix B;
    B.data = q->data;
    B.dtype = DType::u8;
    B.format = WeightFormat::ggml(type.element);
    B.ld = kernels::formats::traits(type.element).row_elements(B.format, K);
    ASSERT_EQ(B.ld * N, static_cast<std::int64_t>(q->nbytes));
    EXPECT_EQ(kernels::formats::traits(type.element).check(B.format, N, K), "");
    EXPECT_EQ(kernels::formats::matrix_bytes(B.format, DType::u8, N, K), q->nbytes);

    std::vector<float> rows(static_cast<std::size_t>(N * K));
    kernels::dequantize_rows(B, 0, N, K, rows.data());
    int bad = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t k = 0; k < K; ++k) {
        const float w = want[n * K + k];
        const float scalar = kernels::formats::decode(B, n, k);
        const float row = rows[static_cast<std::size_t>(n * K + k)];
        if ((!same_bits(scalar, w) || !same_bits(row, w)) && bad++ < 5)
          ADD_FAILURE() << name << " (" << n << ", " << k << "): ggml " << w << ", decode " << scalar
                        << ", dequantize_rows " << row;
      }
    EXPECT_EQ(bad, 0) << name;

    // The exact mode's vector decode at each width this CPU has (dequantize_rows takes the best).
    for (const auto path : {kernels::Int8Path::avx2, kernels::Int8Path::avx512vnni}) {
      if (!kernels::int8_path_supported(path)) continue;
      std::vector<float> v(static_cast<std::size_t>(N * K), -1.0f);
      ASSERT_TRUE(kernels::detail::ggml_dequant_rows(B, 0, N, K, v.data(), path)) << name;
      int wrong = 0;
      for (std::int64_t i = 0; i < N * K; ++i)
        if (!same_bits(v[static_cast<std::size_t>(i)], want[i]) && wrong++ < 5)
          ADD_FAILURE() << name << " " << kernels::int8_path_name(path) << " [" << i << "]: ggml " << want[i]
                        << ", vector decode " << v[static_cast<std::size_t>(i)];
    }
    EXPECT_FALSE(kernels::detail::ggml_dequant_rows(B, 0, N, K, rows.data(), kernels::Int8Path::portable));

    if (which[1] == 'q') {
      // x = e_k for a few k: y[n] = x · W[n] = W[n, k] exactly (one product by 1, the rest by 0).
      for (const std::int64_t k : {std::int64_t{0}, std::int64_t{37}, K - 1}) {
        std::vector<float> x(static_cast<std::size_t>(K), 0.0f), y(static_cast<std::size_t>(N), -1.0f);
        x[static_cast<std::size_t>(k)] = 1.0f;
        kernels::gemm_nt(kernels::RowSource{x.data(), K}, B, kernels::Output{y.data(), N}, 1, N, K);
        for (std::int64_t n = 0; n < N; ++n)
          EXPECT_TRUE(same_bits(y[static_cast<std::size_t>(n)], want[n * K + k] + 0.0f))
              << name << " gemm_nt column " << k << " row " << n << ": " << y[static_cast<std::size_t>(n)] << " vs "
              << want[n * K + k];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GgmlBlocks, ::testing::ValuesIn(kTypes),
                         [](const ::testing::TestParamInfo<GgmlType>& i) { return std::string(i.param.name); });

TEST(GgmlBlocks, TypeTableAgreesWithTheFormats) {
  for (const GgmlType& t : kTypes) {
    const GgufTensorInfo* q = blocks().find(std::string(t.name) + ".q");
    ASSERT_NE(q, nullptr);
    const GgmlTypeInfo* info = ggml_type_info(q->type);
    const WeightFormat f = WeightFormat::ggml(t.element);
    EXPECT_EQ(info->block, f.block_cols) << t.name;
    EXPECT_EQ(static_cast<std::int64_t>(info->block_bytes),
              kernels::formats::traits(t.element).row_elements(f, info->block))
        << t.name;
    EXPECT_TRUE(kernels::formats::inline_scales(f));
  }
}

}  // namespace
}  // namespace moekit
