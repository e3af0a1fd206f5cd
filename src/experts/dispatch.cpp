// plan_dispatch: a stable counting sort of the T*K (token, slot) pairs by expert.
#include <stdexcept>

#include "moekit/experts.hpp"
#include "tensor/expect.hpp"
#include "util/error.hpp"

namespace moekit {

DispatchPlan plan_dispatch(const TensorView& ids, std::int64_t num_experts) {
  detail::expect_tensor("plan_dispatch", "ids", ids, {DType::i32}, detail::trailing("K"));
  if (num_experts < 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::plan_dispatch] num_experts (" << num_experts << ") must be >= 1"));
  DispatchPlan p;
  p.top_k = ids.dim(-1);
  p.num_tokens = ids.rows();
  p.num_experts = num_experts;
  const std::int64_t n = ids.numel();
  const std::int32_t* id = ids.data_as<const std::int32_t>();
  p.counts.assign(static_cast<std::size_t>(num_experts), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    if (id[i] < 0 || id[i] >= num_experts)
      throw std::out_of_range(MOEKIT_MSG("[moekit::plan_dispatch] expert id " << id[i] << " at token "
                                                                            << i / p.top_k << ", slot " << i % p.top_k
                                                                            << " outside [0, " << num_experts << ")"));
    ++p.counts[static_cast<std::size_t>(id[i])];
  }
  p.offsets.assign(static_cast<std::size_t>(num_experts) + 1, 0);
  for (std::int64_t e = 0; e < num_experts; ++e) p.offsets[e + 1] = p.offsets[e] + p.counts[e];
  p.sorted_pairs.resize(static_cast<std::size_t>(n));
  p.inverse.resize(static_cast<std::size_t>(n));
  std::vector<std::int64_t> cursor(p.offsets.begin(), p.offsets.end() - 1);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t pos = cursor[id[i]]++;
    p.sorted_pairs[pos] = i;
    p.inverse[i] = pos;
  }
  return p;
}

}  // namespace moekit
