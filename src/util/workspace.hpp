// A per-thread float scratch buffer for the [T·K, D] row buffers of the grouped forward and the
// backward. Internal.
//
// Up to kKeptFloats the buffer stays with the calling thread between calls (re-faulting tens of
// MB of fresh pages on every call measured ~10 % of a T = 512 forward); larger, rarer requests
// get a buffer freed when the Workspace goes, so a huge batch never pins its memory. The
// contents are not initialised. `Slot` keeps the users apart (a backward may run the forward's
// kernels while it holds its own buffer).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace moekit::detail {

enum class WorkspaceSlot { forward_rows, backward_rows, backward_weights };

class Workspace {
 public:
  static constexpr std::size_t kKeptFloats = std::size_t{64} << 20 >> 2;  // 64 MB of floats

  Workspace(std::size_t floats, WorkspaceSlot slot) {
    if (floats <= kKeptFloats) {
      std::vector<float>& kept = kept_for(slot);
      if (kept.size() < floats) kept.resize(floats);
      data_ = kept.data();
    } else {
      large_.reset(new float[floats]);
      data_ = large_.get();
    }
  }
  float* data() const noexcept { return data_; }

 private:
  static std::vector<float>& kept_for(WorkspaceSlot slot) {
    thread_local std::vector<float> kept[3];
    return kept[static_cast<int>(slot)];
  }
  std::unique_ptr<float[]> large_;
  float* data_ = nullptr;
};

}  // namespace moekit::detail
