// A GGUF model in one file or split in parts as llama.cpp's gguf-split writes them
// (moekit/gguf.hpp's GgufModel): every part found by its name, checked against the first part's
// split keys, and each tensor name in exactly one part.
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "moekit/gguf.hpp"
#include "util/error.hpp"

namespace moekit {

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::gguf] " << file << ": " << what));
}

// A split key of `f` as an integer (u16 in llama.cpp's files; any integer type accepted).
std::int64_t split_key(const GgufFile& f, const char* key) {
  const GgufValue& v = f.get(key);
  if (!v.is_integer()) fail(f.path(), MOEKIT_MSG("metadata '" << key << "' is " << v.describe() << ", not an integer"));
  return v.as_int();
}

// "<prefix>-00002-of-00003.gguf" for part `no` (1-based) of `count`, as llama_split_path writes it.
std::string split_path(const std::string& prefix, std::int64_t no, std::int64_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05" PRId64 "-of-%05" PRId64 ".gguf", no, count);
  return prefix + buf;
}

}  // namespace

std::shared_ptr<const GgufModel> GgufModel::open(const std::string& path) {
  auto f = GgufFile::open(path);
  auto m = std::make_shared<GgufModel>();
  m->path_ = path;
  if (!f->has("split.count") || split_key(*f, "split.count") <= 1) {
    if (f->has("split.count") && split_key(*f, "split.count") < 1)
      fail(path, MOEKIT_MSG("metadata 'split.count' is " << split_key(*f, "split.count") << ", expected >= 1"));
    m->files_.push_back(f);
  } else {
    const std::int64_t count = split_key(*f, "split.count");
    if (count > 99999) fail(path, MOEKIT_MSG("metadata 'split.count' is " << count << ", more than 99999 parts"));
    if (!f->has("split.no")) fail(path, "metadata 'split.count' is set but 'split.no' is missing");
    const std::int64_t no = split_key(*f, "split.no");
    if (no < 0 || no >= count)
      fail(path, MOEKIT_MSG("metadata 'split.no' is " << no << ", outside [0, " << count << ") (split.count)"));
    // The name must end in -NNNNN-of-MMMMM.gguf with this part's number and the count.
    const std::string own_suffix = split_path("", no + 1, count);
    if (path.size() < own_suffix.size() ||
        path.compare(path.size() - own_suffix.size(), own_suffix.size(), own_suffix) != 0)
      fail(path, MOEKIT_MSG("is part " << no + 1 << " of " << count << " (split.no " << no
                                       << "), but its name does not end in '" << own_suffix
                                       << "' as llama.cpp names split parts"));
    const std::string prefix = path.substr(0, path.size() - own_suffix.size());
    for (std::int64_t i = 0; i < count; ++i) {
      const std::string part = split_path(prefix, i + 1, count);
      if (i != no && !std::filesystem::exists(part))
        fail(part, MOEKIT_MSG("missing: part " << i + 1 << " of the " << count << "-part model " << path));
      auto pf = i == no ? f : GgufFile::open(part);
      if (!pf->has("split.no") || !pf->has("split.count"))
        fail(part, "has no 'split.no' / 'split.count': not a part of a split model");
      if (split_key(*pf, "split.count") != count)
        fail(part, MOEKIT_MSG("says split.count " << split_key(*pf, "split.count") << ", where " << path << " says "
                                                  << count));
      if (split_key(*pf, "split.no") != i)
        fail(part, MOEKIT_MSG("says split.no " << split_key(*pf, "split.no") << ", expected " << i));
      m->files_.push_back(pf);
    }
  }
  for (const auto& part : m->files_)
    for (const GgufTensorInfo& t : part->tensors())
      if (!m->where_.emplace(t.name, &t).second)
        fail(part->path(), "tensor '" + t.name + "' is also in " + m->where_.at(t.name)->file);
  if (m->files_.size() > 1 && m->first().has("split.tensors.count")) {
    const std::int64_t want = split_key(m->first(), "split.tensors.count");
    if (want != static_cast<std::int64_t>(m->where_.size()))
      fail(m->first().path(),
           MOEKIT_MSG("says split.tensors.count " << want << ", but the " << m->files_.size() << " parts hold "
                                                  << m->where_.size() << " tensors"));
  }
  return m;
}

std::shared_ptr<const GgufModel> GgufModel::from_file(std::shared_ptr<const GgufFile> file) {
  if (file->has("split.count") && split_key(*file, "split.count") > 1)
    fail(file->path(), "is one part of a split model; open it from a path so the other parts can be found");
  auto m = std::make_shared<GgufModel>();
  m->path_ = file->path();
  m->files_.push_back(std::move(file));
  for (const GgufTensorInfo& t : m->files_.front()->tensors()) m->where_.emplace(t.name, &t);
  return m;
}

const GgufTensorInfo* GgufModel::find(const std::string& name) const noexcept {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second;
}

std::vector<const GgufTensorInfo*> GgufModel::tensors() const {
  std::vector<const GgufTensorInfo*> out;
  for (const auto& [name, t] : where_) out.push_back(t);
  return out;
}

bool is_gguf_path(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

}  // namespace moekit
