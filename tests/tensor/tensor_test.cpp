#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "moekit/tensor.hpp"

namespace moekit {
namespace {

TEST(Tensor, ShapeAndZeroInit) {
  Tensor t({2, 3}, DType::f32);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.view().rows(), 2);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data_as<float>()[i], 0.0f);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
}

TEST(Tensor, RejectsNegativeDims) { EXPECT_THROW(Tensor({2, -1}, DType::f32), std::invalid_argument); }

TEST(Tensor, ReshapeAndSlice) {
  Tensor t = Tensor::from_f32({2, 3}, {0, 1, 2, 3, 4, 5});
  TensorView v = t.view().reshaped({3, 2});
  EXPECT_EQ(v.dim(0), 3);
  EXPECT_THROW(t.view().reshaped({4, 2}), std::invalid_argument);
  TensorView r = t.view().slice_rows(1, 2);
  EXPECT_EQ(r.data_as<float>()[0], 3.0f);
  EXPECT_THROW(t.view().slice_rows(1, 3), std::out_of_range);
  EXPECT_THROW(Tensor::from_f32({2}, {1, 2, 3}), std::invalid_argument);
}

TEST(Tensor, EmptyViewIsUndefined) {
  TensorView v;
  EXPECT_FALSE(v.defined());
  Tensor t({0, 4}, DType::f32);
  EXPECT_TRUE(t.view().defined());
  EXPECT_EQ(t.numel(), 0);
}

TEST(Bf16, RoundToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256.0f), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256.0f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256.0f + 1e-6f), 0x3f81);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
  // The largest finite f32 rounds to +inf in bf16 (as numpy/torch do).
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::max()))));
}

TEST(Bf16, RoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = bf16_to_f32(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), b);
  }
}

TEST(F16, RoundTripsEveryPattern) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), b) << "pattern " << b;
  }
}

TEST(F16, RoundsHalfwayToEven) {
  // Halfway between every pair of adjacent positive finite halves (normals and subnormals):
  // the result must be the even one.
  for (std::uint32_t b = 0; b < 0x7bffu; ++b) {
    const double lo = f16_to_f32(static_cast<std::uint16_t>(b));
    const double hi = f16_to_f32(static_cast<std::uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in f32
    ASSERT_EQ(f32_to_f16(mid), (b % 2 == 0) ? b : b + 1) << "between " << b << " and " << b + 1;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
}

TEST(Convert, FloatDtypes) {
  Tensor a = Tensor::from_f32({3}, {1.5f, -2.25f, 1e-3f});
  Tensor b = to_dtype(a, DType::bf16);
  Tensor c = to_dtype(b, DType::f32);
  EXPECT_EQ(c.data_as<float>()[0], 1.5f);
  EXPECT_EQ(c.data_as<float>()[1], -2.25f);
  EXPECT_NEAR(c.data_as<float>()[2], 1e-3f, 1e-5f);
  Tensor i({3}, DType::i32);
  EXPECT_THROW(convert(a, i), std::invalid_argument);
  Tensor wrong({4}, DType::f32);
  EXPECT_THROW(convert(a, wrong), std::invalid_argument);
}

}  // namespace
}  // namespace moekit

namespace moekit {
namespace {

// Every byte of the two 8-bit float encodings against their definitions, written with ldexp:
// E4M3FN (OCP): bias 7, subnormals m·2^-9, no infinities, S.1111.111 the only NaN; E8M0:
// 2^(e − 127), 0xFF NaN.
TEST(Tensor, Fp8EncodingsWidenExactly) {
  for (int b = 0; b < 256; ++b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const float e4m3 = e4m3_to_f32(static_cast<std::uint8_t>(b));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(e4m3)) << b;
    } else {
      const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
      EXPECT_EQ(e4m3, static_cast<float>(s ? -mag : mag)) << b;
      EXPECT_EQ(std::signbit(e4m3), s == 1) << b;  // -0 stays -0
    }
    const float e8m0 = e8m0_to_f32(static_cast<std::uint8_t>(b));
    if (b == 255) {
      EXPECT_TRUE(std::isnan(e8m0));
    } else {
      EXPECT_EQ(e8m0, std::ldexp(1.0f, b - 127)) << b;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);  // the largest finite E4M3
  EXPECT_EQ(dtype_size(DType::f8_e4m3), 1u);
  EXPECT_STREQ(dtype_name(DType::f8_e8m0), "f8_e8m0");
}

}  // namespace
}  // namespace moekit
