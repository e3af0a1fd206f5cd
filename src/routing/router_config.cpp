#include <cmath>
#include <sstream>
#include <stdexcept>

#include "moekit/routing.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {
const char* name(ScoreFunc f) {
  switch (f) {
    case ScoreFunc::softmax:
      return "softmax";
    case ScoreFunc::sigmoid:
      return "sigmoid";
    case ScoreFunc::sqrt_softplus:
      return "sqrt_softplus";
    case ScoreFunc::softmax_selected:
      return "softmax_selected";
    case ScoreFunc::sigmoid_selected:
      return "sigmoid_selected";
  }
  return "?";
}
const char* name(GroupMode g) {
  switch (g) {
    case GroupMode::none:
      return "none";
    case GroupMode::max:
      return "max";
    case GroupMode::top2_sum:
      return "top2_sum";
  }
  return "?";
}
const char* name(Renorm r) {
  switch (r) {
    case Renorm::none:
      return "none";
    case Renorm::sum:
      return "sum";
    case Renorm::sum_eps:
      return "sum_eps";
    case Renorm::sum_floor:
      return "sum_floor";
  }
  return "?";
}
}  // namespace

void validate(const RouterConfig& cfg) {
  const auto fail = [](const std::string& what) {
    throw std::invalid_argument("[moekit::RouterConfig] " + what);
  };
  const std::int64_t E = cfg.num_experts;
  if (E < 1) fail(MOEKIT_MSG("num_experts (" << E << ") must be >= 1"));
  if (cfg.top_k < 1 || cfg.top_k > E)
    fail(MOEKIT_MSG("top_k (" << cfg.top_k << ") must be in [1, num_experts (" << E << ")]"));
  if (cfg.group_mode != GroupMode::none) {
    if (cfg.n_group < 1) fail(MOEKIT_MSG("n_group (" << cfg.n_group << ") must be >= 1"));
    if (E % cfg.n_group != 0)
      fail(MOEKIT_MSG("num_experts (" << E << ") is not divisible by n_group (" << cfg.n_group << ")"));
    if (cfg.topk_group < 1 || cfg.topk_group > cfg.n_group)
      fail(MOEKIT_MSG("topk_group (" << cfg.topk_group << ") must be in [1, n_group (" << cfg.n_group << ")]"));
    const std::int64_t per_group = E / cfg.n_group;
    if (cfg.group_mode == GroupMode::top2_sum && per_group < 2)
      fail(MOEKIT_MSG("group mode top2_sum needs >= 2 experts per group, got " << per_group << " (num_experts "
                                                                                << E << " / n_group " << cfg.n_group
                                                                                << ")"));
    if (cfg.topk_group * per_group < cfg.top_k)
      fail(MOEKIT_MSG("topk_group (" << cfg.topk_group << ") * experts per group (" << per_group
                                     << ") = " << cfg.topk_group * per_group << " < top_k (" << cfg.top_k
                                     << "): not enough experts survive the group limit"));
  }
  if (!std::isfinite(cfg.routed_scaling_factor) || cfg.routed_scaling_factor < 0.0f)
    fail(MOEKIT_MSG("routed_scaling_factor (" << cfg.routed_scaling_factor << ") must be finite and >= 0"));
  if (!(cfg.renorm_eps >= 0.0) || !std::isfinite(cfg.renorm_eps))
    fail(MOEKIT_MSG("renorm_eps (" << cfg.renorm_eps << ") must be finite and >= 0"));
}

void set_router_knob(RouterConfig& cfg, const std::string& key, const std::string& value) {
  const auto bad = [&](const char* accepted) {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::set_router_knob] " << key << " = '" << value
                                                                        << "' (accepted: " << accepted << ")"));
  };
  const auto boolean = [&]() {
    if (value == "true" || value == "1") return true;
    if (value == "false" || value == "0") return false;
    bad("true, false");
    return false;  // not reached: bad() throws
  };
  if (key == "mask_fill") {
    if (value == "neg_inf") {
      cfg.mask_fill = MaskFill::neg_inf;
    } else if (value == "legacy_zero") {
      cfg.mask_fill = MaskFill::legacy_zero;
    } else {
      bad("neg_inf, legacy_zero");
    }
  } else if (key == "renorm") {
    if (value == "none") {
      cfg.renorm = Renorm::none;
    } else if (value == "sum") {
      cfg.renorm = Renorm::sum;
    } else if (value == "sum_eps") {
      cfg.renorm = Renorm::sum_eps;
    } else if (value == "sum_floor") {
      cfg.renorm = Renorm::sum_floor;
    } else {
      bad("none, sum, sum_eps, sum_floor");
    }
  } else if (key == "renorm_only_if_k_gt_1") {
    cfg.renorm_only_if_k_gt_1 = boolean();
  } else if (key == "scale_only_without_renorm") {
    cfg.scale_only_without_renorm = boolean();
  } else if (key == "guard_zero_sum") {
    cfg.guard_zero_sum = boolean();
  } else if (key == "routed_scaling_factor") {
    std::size_t used = 0;
    float v = 0.0f;
    try {
      v = std::stof(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != value.size() || value.empty() || !std::isfinite(v) || v < 0.0f) bad("a finite number >= 0");
    cfg.routed_scaling_factor = v;
  } else {
    throw std::invalid_argument(MOEKIT_MSG("[moekit::set_router_knob] unknown knob '"
                                           << key
                                           << "' (knobs: mask_fill, renorm, renorm_only_if_k_gt_1, "
                                              "scale_only_without_renorm, guard_zero_sum, routed_scaling_factor)"));
  }
}

std::string describe(const RouterConfig& cfg) {
  std::ostringstream os;
  os << "E=" << cfg.num_experts << " K=" << cfg.top_k << " score=" << name(cfg.score_func);
  if (cfg.has_router_bias) os << " router_bias";
  if (cfg.has_selection_bias) os << " selection_bias";
  if (cfg.group_mode != GroupMode::none) {
    os << " groups=" << name(cfg.group_mode) << "(G=" << cfg.n_group << ",Kg=" << cfg.topk_group
       << (cfg.mask_fill == MaskFill::legacy_zero ? ",legacy_zero_mask" : "") << ")";
  }
  if (cfg.weights_from == WeightsFrom::selection_scores) os << " weights=biased";
  os << " renorm=" << name(cfg.renorm);
  if (cfg.renorm != Renorm::none && cfg.renorm_only_if_k_gt_1) os << "(K>1)";
  os << " scale=" << cfg.routed_scaling_factor;
  if (cfg.scale_only_without_renorm) os << "(if not renormed)";
  if (cfg.weight_on_input) os << " weight_on_input";
  return os.str();
}

}  // namespace moekit
