// The bf16 layer golden against torch running it as a bf16 model (tools/gen_bf16_goldens.py):
// moekit's bf16 compute mode and its exact f32 mode on the same bf16 input, their distance from
// torch's bf16 result printed and bounded. torch rounds to bf16 after every operation, moekit's
// mode only the rows entering each projection, so neither equals torch; both must sit within
// bf16's rounding noise of it (max and RMS bounds; the figures are printed and recorded in
// docs/numerics.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/gemm.hpp"
#include "moekit/model.hpp"
#include "moekit/npy.hpp"

namespace moekit {
namespace {

const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/layers/deepseek_v3_bf16";

// Root-mean-square of y - ref over the RMS of ref.
double rms_rel(const Tensor& y, const Tensor& ref) {
  double e2 = 0, r2 = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    const double r = ref.data_as<float>()[i], d = y.data_as<float>()[i] - r;
    e2 += d * d;
    r2 += r * r;
  }
  return std::sqrt(e2 / r2);
}

double max_rel(const Tensor& y, const Tensor& ref) {
  double err = 0, mx = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(y.data_as<float>()[i]) - ref.data_as<float>()[i]));
    mx = std::max(mx, std::fabs(static_cast<double>(ref.data_as<float>()[i])));
  }
  return err / mx;
}

TEST(Bf16Golden, DeepSeekV3AgainstTorchInBf16) {
  MoeLayer layer = load_moe_layer(kDir, load_hf_config(kDir), 1);
  const Tensor x = read_npy(kDir + "/torch_bf16/input.npy");
  const Tensor y_torch = read_npy(kDir + "/torch_bf16/output.npy");
  const Tensor ids_torch = read_npy(kDir + "/torch_bf16/ids.npy");
  const Tensor xb = to_dtype(x, DType::bf16);  // exact: the input holds bf16 values
  ASSERT_EQ(std::memcmp(to_dtype(xb, DType::f32).data(), x.data(), x.nbytes()), 0);

  ForwardInfo info;
  const Tensor y_exact = to_dtype(layer.forward(xb, &info), DType::f32);
  // The router stays fp32 in both: the routing torch used (as sets per token; the slot order is
  // the same here).
  ASSERT_EQ(std::memcmp(info.routing.ids.data(), ids_torch.data(), ids_torch.nbytes()), 0);
  const double err_exact = max_rel(y_exact, y_torch), rms_exact = rms_rel(y_exact, y_torch);
  for (const kernels::Bf16Path path : kernels::kBf16Paths) {
    if (!kernels::bf16_path_supported(path)) {
      std::printf("[ bf16 golden ] this CPU has no %s: that path was not run\n", kernels::bf16_path_name(path));
      continue;
    }
    kernels::detail::set_bf16_path_for_tests(path);
    layer.set_bf16_activations(true);
    const Tensor y_bf16 = to_dtype(layer.forward(xb), DType::f32);
    layer.set_bf16_activations(false);
    const double err_bf16 = max_rel(y_bf16, y_torch), rms_bf16 = rms_rel(y_bf16, y_torch);
    std::printf("[ bf16 golden ] vs torch in bf16: bf16 mode (%s) max %.2e rms %.2e; exact f32 mode max %.2e rms %.2e; "
                "bf16 mode vs exact mode rms %.2e\n",
                kernels::bf16_path_name(path), err_bf16, rms_bf16, err_exact, rms_exact, rms_rel(y_bf16, y_exact));
    EXPECT_LE(err_bf16, 1e-2);  // a few bf16 ulps (2^-8 = 3.9e-3) of the largest output
    EXPECT_LE(rms_bf16, 1e-2);
  }
  kernels::detail::set_bf16_path_for_tests(std::nullopt);
  EXPECT_LE(err_exact, 1.5e-2);
}

}  // namespace
}  // namespace moekit
