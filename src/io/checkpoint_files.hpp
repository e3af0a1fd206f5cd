// The parts of a checkpoint folder that the block's checkpoint (checkpoint.cpp) and the language
// model's (src/lm/checkpoint.cpp) share: the atomic folder write, and the training-state file
// (kTrainingStateFile: a safetensors file whose metadata names its format, version, optimizer,
// step and RNG state). Internal.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "moekit/checkpoint.hpp"

namespace moekit::detail {

/// Writes folder `dir` atomically: fill(partial) writes every file under `<dir>.partial`; an
/// existing `dir` is moved to `<dir>.old`, the new folder renamed into place, then `<dir>.old`
/// removed, so the last complete checkpoint is under `dir` or `<dir>.old` at every instant.
/// Throws std::runtime_error ("[moekit::<who>] ...") naming the path on an I/O failure; what
/// fill throws propagates after `<dir>.partial` is removed.
void write_folder(const std::string& dir, const char* who,
                  const std::function<void(const std::filesystem::path& partial)>& fill);

/// `text` as file `path`. Throws std::runtime_error naming `who` and the path.
void write_text(const std::filesystem::path& path, const std::string& text, const char* who);

/// `tensors` (f32, or i32 for the balancer's counts) as a safetensors file with metadata `meta`.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& meta);

/// The training-state file's metadata: format, version, step, RNG state, the optimizer's kind and
/// steps, `balancer` ("sign", "proportional", "none", or "lm" for a language model) and the
/// user JSON.
std::map<std::string, std::string> state_meta(const Optimizer& opt, const TrainingState& st,
                                              const std::string& balancer);

/// A training-state file read and checked against `optimizer`'s kind: its tensors (the optimizer
/// state, "balancer.counts" i32, "selection_bias"), step, RNG state, optimizer steps and user JSON.
struct StateFile {
  NamedTensors tensors;
  TrainingState state;
  std::int64_t optimizer_steps = 0;
};

/// Reads `<dir>/kTrainingStateFile`. Throws std::runtime_error for a missing (saying where an
/// interrupted save left the previous one), truncated or malformed file and
/// std::invalid_argument for a foreign one (another format, version or optimizer; a
/// non-numeric field; a tensor of another dtype), naming `who` and the file.
StateFile read_state_file(const std::string& dir, const Optimizer& optimizer, const char* who);

}  // namespace moekit::detail
