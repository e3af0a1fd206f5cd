// The expert bodies' activations (kernels/activation.hpp). SwiGLU runs vectorised (Highway's Exp)
// on every target: each element within a few ULP of silu(gate) · up taken in double, and the
// answers of torch's x / (1 + exp(-x)) at the edges (±0, ±∞, NaN, exp(-x) past FLT_MAX: -0).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/activation.hpp"
#include "kernels/targets.hpp"

namespace moekit {
namespace {

// Distance in representable floats (same sign; 0 and -0 are one apart).
std::int64_t ulps(float a, float b) {
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<std::int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<std::int32_t>::min() - ib;
  return std::llabs(static_cast<std::int64_t>(ia) - ib);
}

TEST(Activation, SwigluWithinFourUlpOfTheExactValueOnEveryTarget) {
  std::mt19937 rng(41);
  std::vector<float> gate, up;
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f);
  for (int i = 0; i < 20000; ++i) {
    gate.push_back(i % 4 == 0 ? wide(rng) : d(rng));
    up.push_back(d(rng));
  }
  testing::for_each_target([&](std::int64_t) {
    std::vector<float> h(gate.size());
    kernels::apply_body(BodyKind::swiglu, 0, 0, gate.data(), up.data(), h.data(),
                        static_cast<std::int64_t>(gate.size()));
    std::int64_t worst = 0;
    for (std::size_t i = 0; i < gate.size(); ++i) {
      const double g = gate[i];
      const float want = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
      if (std::fabs(want) < 1e-30f) {  // exp(gate) near or past FLT_MIN: 0 is within 1e-30
        ASSERT_LE(std::fabs(h[i] - want), 1e-30f) << "gate " << gate[i] << " up " << up[i];
        continue;
      }
      const std::int64_t u = ulps(h[i], want);
      worst = std::max(worst, u);
      ASSERT_LE(u, 4) << "gate " << gate[i] << " up " << up[i] << ": " << h[i] << " vs " << want;
    }
    std::printf("[          ] swiglu: worst %lld ULP over %zu elements\n", static_cast<long long>(worst),
                gate.size());
  });
}

TEST(Activation, SwigluEdgesAsTheScalarFormOnEveryTarget) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // gate, up, expected h (NaN: any NaN)
  const std::vector<std::array<float, 3>> cases = {
      {0.0f, 5.0f, 0.0f},     {-0.0f, 5.0f, -0.0f},  {inf, 2.0f, inf},        {-inf, 2.0f, nan},
      {nan, 1.0f, nan},       {1.0f, nan, nan},      {-200.0f, 1.0f, -0.0f},  {-200.0f, -1.0f, 0.0f},
      {200.0f, 1.0f, 200.0f}, {100.0f, 0.5f, 50.0f}, {-90.0f, 1.0f, -0.0f},  {-90.0f, 3.0f, -0.0f},
  };
  for (const std::int64_t n : {1, 7, 16, 17, 33}) {  // the tail and whole vectors
    testing::for_each_target([&](std::int64_t) {
      for (const auto& c : cases) {
        std::vector<float> g(static_cast<std::size_t>(n), c[0]), u(static_cast<std::size_t>(n), c[1]), h(g.size());
        kernels::apply_body(BodyKind::swiglu, 0, 0, g.data(), u.data(), h.data(), n);
        for (const float v : h) {
          if (std::isnan(c[2])) {
            EXPECT_TRUE(std::isnan(v)) << "gate " << c[0] << " up " << c[1] << " gave " << v;
          } else {
            EXPECT_EQ(v, c[2]) << "gate " << c[0] << " up " << c[1];
            EXPECT_EQ(std::signbit(v), std::signbit(c[2])) << "gate " << c[0] << " up " << c[1];
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace moekit
