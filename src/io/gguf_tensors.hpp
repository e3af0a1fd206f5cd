// A GGUF model's tensors read by name with their shapes checked and their type mapped onto the
// kernels' formats, used in place from the mapping; the MoE block's loader and the whole model's
// reader share it. Internal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/experts.hpp"
#include "moekit/gguf.hpp"
#include "moekit/tensor.hpp"

namespace moekit::detail {

/// The ggml types moekit computes on ("f32, f16, bf16, q4_0, ..."), for messages.
std::string gguf_supported_types();

/// Tensors named `prefix` + a relative name ("blk.3." + "attn_q.weight"), with messages naming
/// the file, the tensor and the expectation (std::runtime_error).
class GgufTensors {
 public:
  GgufTensors(const GgufModel& m, std::string prefix) : m_(m), prefix_(std::move(prefix)) {}

  std::string full(const std::string& rel) const { return prefix_ + rel; }
  const GgufTensorInfo* find(const std::string& rel) const { return m_.find(full(rel)); }
  [[noreturn]] void fail(const std::string& rel, const std::string& what) const;

  /// `rel` with extents `ne` (innermost first; trailing 1s beyond them allowed, as llama.cpp does).
  const GgufTensorInfo& get(const std::string& rel, const std::vector<std::int64_t>& ne) const;
  /// A small float tensor (norms, biases, gates) as an owned f32 [numel], every value finite.
  Tensor f32(const std::string& rel, const std::vector<std::int64_t>& ne) const;
  /// `rel` [E] x [out, in] (ne {in, out, E}, or {in, out} for E = 0) as an ExpertMatrix in place.
  ExpertMatrix matrix(const std::string& rel, std::int64_t E, std::int64_t out, std::int64_t in) const;

 private:
  const GgufModel& m_;
  std::string prefix_;
};

}  // namespace moekit::detail
