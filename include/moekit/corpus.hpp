// Text for `moekit train`: files and folders read as bytes, checked to be text, split into a
// training and a held-out part (docs/training.md, "Data").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moekit {

/// The default training text: the licence texts every Debian and Ubuntu system ships
/// (base-files, an Essential package), about 0.24 MB of English prose.
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses";

struct TextCorpus {
  std::vector<std::uint8_t> train, held_out;
  std::vector<std::string> files;    ///< read, in order (canonical paths, each once)
  std::vector<std::string> skipped;  ///< binary or empty files skipped inside folders
  std::int64_t bytes = 0;            ///< train + held_out
};

/// Reads `paths` (files, or folders walked recursively in sorted order; a file reached twice,
/// e.g. through a symlink, is read once) as bytes and splits the concatenation into blocks of
/// `block` bytes of which every `held_out_every`-th (the 10th, 20th, ...) is held out; a text
/// with fewer blocks holds out its last 1/held_out_every. A file named directly must be
/// non-empty text (no NUL byte, at most 1 % other control bytes besides tab, newline, carriage
/// return, form feed, vertical tab and escape); inside a folder such files are skipped and
/// listed. Throws std::invalid_argument naming the path: missing, unreadable, empty, binary, or
/// no text at all.
TextCorpus load_text_corpus(const std::vector<std::string>& paths, std::int64_t block = 4096,
                            std::int64_t held_out_every = 10);

}  // namespace moekit
