// load_text_corpus (moekit/corpus.hpp).
#include "moekit/corpus.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <stdexcept>

#include "util/error.hpp"

namespace moekit {

namespace {

namespace fs = std::filesystem;

// Why `bytes` is not text, or "" if it is.
std::string not_text(const std::vector<std::uint8_t>& bytes) {
  if (bytes.empty()) return "is empty";
  std::size_t control = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const std::uint8_t b = bytes[i];
    if (b == 0) return MOEKIT_MSG("is binary (a NUL byte at offset " << i << ")");
    if (b < 32 && b != '\t' && b != '\n' && b != '\r' && b != '\f' && b != '\v' && b != 0x1b) ++control;
    if (b == 127) ++control;
  }
  if (control * 100 > bytes.size())
    return MOEKIT_MSG("is binary (" << control << " control bytes in " << bytes.size() << ")");
  return "";
}

std::vector<std::uint8_t> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] cannot read '" << p.string() << "'"));
  std::vector<std::uint8_t> out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] cannot read '" << p.string() << "'"));
  return out;
}

}  // namespace

TextCorpus load_text_corpus(const std::vector<std::string>& paths, std::int64_t block, std::int64_t held_out_every) {
  if (block < 1 || held_out_every < 2)
    throw std::invalid_argument("[moekit::load_text_corpus] block must be >= 1 and held_out_every >= 2");
  if (paths.empty()) throw std::invalid_argument("[moekit::load_text_corpus] no paths given");
  TextCorpus c;
  std::set<std::string> seen;
  std::vector<std::uint8_t> all;
  const auto add = [&](const fs::path& p, bool named) {
    std::error_code ec;
    const std::string canon = fs::canonical(p, ec).string();
    if (ec) throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] cannot resolve '" << p.string() << "'"));
    if (!seen.insert(canon).second) return;
    const std::vector<std::uint8_t> bytes = read_file(p);
    const std::string why = not_text(bytes);
    if (!why.empty()) {
      if (named) throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] '" << p.string() << "' " << why));
      c.skipped.push_back(p.string() + " (" + why + ")");
      return;
    }
    if (!all.empty() && all.back() != '\n') all.push_back('\n');
    all.insert(all.end(), bytes.begin(), bytes.end());
    c.files.push_back(canon);
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (ec || !fs::exists(st))
      throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] '" << path << "' does not exist"));
    if (fs::is_directory(st)) {
      std::vector<fs::path> files;
      for (fs::recursive_directory_iterator it(path, fs::directory_options::skip_permission_denied, ec), end;
           !ec && it != end; it.increment(ec))
        if (it->is_regular_file(ec)) files.push_back(it->path());
      if (ec) throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] cannot list '" << path << "': " << ec.message()));
      std::sort(files.begin(), files.end());
      const std::size_t before = c.files.size();
      for (const fs::path& f : files) add(f, false);
      if (c.files.size() == before && files.empty())
        throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] folder '" << path << "' holds no files"));
    } else if (fs::is_regular_file(st)) {
      add(path, true);
    } else {
      throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] '" << path << "' is not a file or folder"));
    }
  }
  if (all.empty())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::load_text_corpus] no text in the given paths ("
                                           << c.skipped.size() << " files skipped as binary or empty)"));
  const std::int64_t n = static_cast<std::int64_t>(all.size());
  const std::int64_t blocks = (n + block - 1) / block;
  if (blocks >= held_out_every) {
    for (std::int64_t b = 0; b < blocks; ++b) {
      auto& dst = (b % held_out_every == held_out_every - 1) ? c.held_out : c.train;
      dst.insert(dst.end(), all.begin() + b * block, all.begin() + std::min(n, (b + 1) * block));
    }
  } else {
    const std::int64_t cut = n - n / held_out_every;
    c.train.assign(all.begin(), all.begin() + cut);
    c.held_out.assign(all.begin() + cut, all.end());
  }
  c.bytes = n;
  return c;
}

}  // namespace moekit
