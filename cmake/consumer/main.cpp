// Routes two tokens through the installed library: prints "ok 3 1" (the top-1 experts).
#include <cstdio>

#include "moekit/moekit.hpp"

int main() {
  moekit::RouterConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 1;
  const moekit::Tensor logits = moekit::Tensor::from_f32({2, 4}, {0.f, 1.f, 2.f, 3.f, 0.f, 5.f, 1.f, 2.f});
  const moekit::Routing r = moekit::route(cfg, logits);
  const int* ids = r.ids.data_as<int>();
  std::printf("ok %d %d\n", ids[0], ids[1]);
  return ids[0] == 3 && ids[1] == 1 ? 0 : 1;
}
