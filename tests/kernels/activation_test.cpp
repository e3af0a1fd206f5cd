// The expert bodies' activations (kernels/activation.hpp). SwiGLU runs vectorised (Highway's Exp)
// on every target: each element within a few ULP of silu(gate) · up taken in double, and the
// answers of torch's x / (1 + exp(-x)) at the edges (±0, ±∞, NaN, exp(-x) past FLT_MAX: -0,
// |x| up to FLT_MAX — Exp's own argument stays in its range; the fuzzer's UBSan build, on
// Highway's scalar target, found a NaN reaching its integer conversion).
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

// Every float with |gate| in [86, 89]: where exp(-|gate|) turns denormal (past 87.34) and the
// two thresholds the vector σ splits its work at (87 and 87.5). up = 1e30 lifts silu's tiny
// negative side into normal floats, so σ itself is checked: within 4 ULP where exp(gate) is
// normal, 0 allowed only where it is not (to Exp's error of 1 ULP).
TEST(Activation, SwigluAcrossTheDenormalEdgeOnEveryTarget) {
  std::vector<float> gate;
  for (float v = 86.0f; v <= 89.0f; v = std::nextafter(v, 100.0f)) {
    gate.push_back(v);
    gate.push_back(-v);
  }
  const std::vector<float> up(gate.size(), 1e30f);
  const double flt_min = std::numeric_limits<float>::min();
  testing::for_each_target([&](std::int64_t) {
    std::vector<float> h(gate.size());
    kernels::apply_body(BodyKind::swiglu, 0, 0, gate.data(), up.data(), h.data(),
                        static_cast<std::int64_t>(gate.size()));
    for (std::size_t i = 0; i < gate.size(); ++i) {
      const double g = gate[i], e = std::exp(-std::fabs(g));
      if (g < 0 && e < flt_min * (1.0 + 0x1p-22) && h[i] == 0.0f) continue;  // flushed, as torch's
      const float want = static_cast<float>(g * (g >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e)) * up[i]);
      ASSERT_LE(ulps(h[i], want), 4) << "gate " << gate[i] << ": " << h[i] << " vs " << want;
    }
  });
}

TEST(Activation, SwigluEdgesAsTheScalarFormOnEveryTarget) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // gate, up, expected h (NaN: any NaN)
  const std::vector<std::array<float, 3>> cases = {
      {0.0f, 5.0f, 0.0f},     {-0.0f, 5.0f, -0.0f},  {inf, 2.0f, inf},        {-inf, 2.0f, nan},
      {nan, 1.0f, nan},       {1.0f, nan, nan},      {-200.0f, 1.0f, -0.0f},  {-200.0f, -1.0f, 0.0f},
      {200.0f, 1.0f, 200.0f}, {100.0f, 0.5f, 50.0f}, {-90.0f, 1.0f, -0.0f},  {-90.0f, 3.0f, -0.0f},
      {1e30f, 2.0f, 2e30f},   {-1e30f, 1.0f, -0.0f}, {-3.4e38f, 1.0f, -0.0f}, {104.0f, 1.0f, 104.0f},
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

// The backward: dgate = dh · up · silu'(gate), dup = dh · silu(gate) against double, on every
// target; the bound allows silu'(v) = σ(1 + v(1 − σ))'s cancellation near its root (v ≈ −1.28).
// dup written over dh (the aliasing the header allows) gives the same values.
TEST(Activation, SwigluBackwardMatchesDoubleOnEveryTarget) {
  std::mt19937 rng(42);
  std::normal_distribution<float> d(0.0f, 4.0f);
  std::vector<float> gate, up, dh;
  for (int i = 0; i < 10001; ++i) {
    gate.push_back(i % 5 == 0 ? -1.278f + 1e-3f * d(rng) : d(rng));
    up.push_back(d(rng));
    dh.push_back(d(rng));
  }
  testing::for_each_target([&](std::int64_t) {
    const std::int64_t n = static_cast<std::int64_t>(gate.size());
    std::vector<float> dg(gate.size()), du(gate.size()), dh_in_place = dh, dg2(gate.size());
    kernels::apply_body_backward(BodyKind::swiglu, 0, 0, gate.data(), up.data(), dh.data(), dg.data(), du.data(), n);
    kernels::apply_body_backward(BodyKind::swiglu, 0, 0, gate.data(), up.data(), dh_in_place.data(), dg2.data(),
                                 dh_in_place.data(), n);
    for (std::size_t i = 0; i < gate.size(); ++i) {
      const double a = gate[i], sg = 1.0 / (1.0 + std::exp(-a));
      const double want_du = static_cast<double>(dh[i]) * a * sg;
      const double want_dg = static_cast<double>(dh[i]) * up[i] * sg * (1.0 + a * (1.0 - sg));
      const double scale = std::fabs(static_cast<double>(dh[i]) * up[i]);
      ASSERT_NEAR(du[i], want_du, 8 * 6e-8 * std::fabs(want_du) + 1e-30) << "gate " << a;
      ASSERT_NEAR(dg[i], want_dg, 8 * 6e-8 * std::fabs(want_dg) + 4e-7 * scale + 1e-30) << "gate " << a;
      ASSERT_EQ(dh_in_place[i], du[i]);
      ASSERT_EQ(dg2[i], dg[i]);
    }
  });
}

}  // namespace
}  // namespace moekit
