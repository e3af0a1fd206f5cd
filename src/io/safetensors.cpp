// safetensors reading: mmap, strict header validation, sharded checkpoints.
// Format and the reference validation (pinned):
// https://github.com/huggingface/safetensors/blob/v0.4.5/safetensors/src/tensor.rs
// Differences from the reference, on purpose:
//  - duplicate JSON keys (tensor names, entry fields, metadata keys) are rejected; the reference
//    (serde) and nlohmann::json would silently keep one of them;
//  - gaps between tensors in the data buffer are allowed (the reference requires the entries to
//    tile the buffer exactly); overlaps are rejected.
// Files are untrusted input: every offset and size is checked before it is used, and all
// arithmetic on them is overflow-checked.
#include "moekit/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "util/error.hpp"
#include "util/mapped_file.hpp"

namespace moekit {

namespace {

// ordered_json keeps header order, which names() promises.
using Json = nlohmann::ordered_json;

constexpr std::uint64_t kMaxHeader = 100'000'000;
// A valid header nests 3 deep (root object -> entry -> shape array); anything much deeper is
// garbage, and bounding it keeps the DOM small and error printing cheap.
constexpr int kMaxDepth = 8;
constexpr const char* kComputable = "F32, BF16, F16, I32, U8, U32, F8_E4M3, F8_E8M0";

struct DTypeSpec {
  const char* name;
  unsigned bits;  // per element
  std::optional<DType> dtype;
};

const std::vector<DTypeSpec>& dtype_specs() {
  static const std::vector<DTypeSpec> kSpecs = {
      {"BOOL", 8, std::nullopt},    {"U8", 8, DType::u8},           {"I8", 8, std::nullopt},
      {"F8_E5M2", 8, std::nullopt}, {"F8_E4M3", 8, DType::f8_e4m3}, {"F8_E8M0", 8, DType::f8_e8m0},
      {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},      {"F16", 16, DType::f16},
      {"BF16", 16, DType::bf16},    {"I32", 32, DType::i32},        {"U32", 32, DType::u32},
      {"F32", 32, DType::f32},      {"F64", 64, std::nullopt},      {"I64", 64, std::nullopt},
      {"U64", 64, std::nullopt},    {"F4", 4, std::nullopt},        {"F6_E2M3", 6, std::nullopt},
      {"F6_E3M2", 6, std::nullopt}, {"C64", 64, std::nullopt},
  };
  return kSpecs;
}

const DTypeSpec* find_spec(const std::string& name) {
  for (const DTypeSpec& s : dtype_specs())
    if (name == s.name) return &s;
  return nullptr;
}

std::string known_dtypes() {
  std::string out;
  for (const DTypeSpec& s : dtype_specs()) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

// A JSON value for a message, bounded in length.
std::string brief(const Json& j) {
  std::string s = j.dump(-1, ' ', true, Json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::safetensors] " << file << ": " << what));
}
[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor,
                              const std::string& what) {
  throw std::runtime_error(
      MOEKIT_MSG("[moekit::safetensors] " << file << ": tensor '" << tensor << "' " << what));
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) noexcept {
  for (const DTypeSpec& s : dtype_specs())
    if (s.dtype == dtype) return s.name;
  return "?";  // not reached: every DType has a spec
}

const std::vector<std::string>& safetensors_dtype_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> out;
    for (const DTypeSpec& s : dtype_specs()) out.emplace_back(s.name);
    return out;
  }();
  return kNames;
}

// --- SafetensorsFile ---------------------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() {
  if (mapped_ && base_ != nullptr) ::munmap(const_cast<std::uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  detail::MappedFile m;
  // The descriptor is kept for read(): the file mapped, even if its path is replaced later.
  if (const std::string why = detail::map_file(path, true, m); !why.empty()) fail(path, why);
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->base_ = m.data;
  f->size_ = m.size;
  f->mapped_ = m.data != nullptr;
  f->fd_ = m.fd;
  f->parse(path);
  return f;
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::from_bytes(std::vector<std::uint8_t> bytes,
                                                                   const std::string& name) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = name;
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  f->parse(name);
  return f;
}

namespace {

// The header's JSON: nesting bounded, duplicate keys in any object rejected, an object at the top.
Json parse_header_json(const std::string& name, const char* text, std::size_t n) {
  // Parse with a callback that bounds nesting and rejects duplicate keys in any object.
  std::vector<std::set<std::string>> keys;
  const Json::parser_callback_t cb = [&](int depth, Json::parse_event_t event,
                                         Json& parsed) -> bool {
    if (depth > kMaxDepth)
      fail(name, MOEKIT_MSG("header JSON nests deeper than " << kMaxDepth << " levels"));
    switch (event) {
      case Json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get_ref<const std::string&>()).second)
          fail(name,
               "duplicate key \"" + parsed.get_ref<const std::string&>() + "\" in the header JSON");
        break;
      default:
        break;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text, text + n, cb);
  } catch (const Json::exception& e) {
    fail(name, MOEKIT_MSG("header is not valid JSON: " << e.what()));
  }
  if (!root.is_object())
    fail(name, MOEKIT_MSG("header must be a JSON object, got " << root.type_name()));

  return root;
}

// One tensor entry {dtype, shape, data_offsets} of the header, checked against the data buffer.
TensorInfo parse_entry(const std::string& name, const std::string& key, const Json& v, std::size_t buffer_size,
                       const std::string& file) {
  if (!v.is_object()) fail_tensor(name, key, "entry must be an object, got " + brief(v));
  for (auto f = v.begin(); f != v.end(); ++f)
    if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
      fail_tensor(name, key, "has unexpected field \"" + f.key() + "\" (expected dtype, shape, data_offsets)");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) fail_tensor(name, key, MOEKIT_MSG("is missing field \"" << field << "\""));
  TensorInfo info;
  info.name = key;
  info.file = file;
  const Json& jd = v.at("dtype");
  if (!jd.is_string()) fail_tensor(name, key, "dtype must be a string, got " + brief(jd));
  info.dtype_name = jd.get<std::string>();
  const DTypeSpec* spec = find_spec(info.dtype_name);
  if (spec == nullptr)
    fail_tensor(name, key, "has unknown dtype \"" + info.dtype_name + "\" (known: " + known_dtypes() + ")");
  info.dtype = spec->dtype;
  info.element_size = spec->bits % 8 == 0 ? spec->bits / 8 : 0;

  const Json& js = v.at("shape");
  if (!js.is_array()) fail_tensor(name, key, "shape must be an array of non-negative integers, got " + brief(js));
  for (const Json& d : js) {
    if (!d.is_number_integer() ||
        (d.is_number_unsigned() ? d.get<std::uint64_t>() > INT64_MAX : d.get<std::int64_t>() < 0))
      fail_tensor(name, key, "shape must be an array of non-negative integers, got " + brief(js));
    info.shape.push_back(d.get<std::int64_t>());
  }

  const Json& jo = v.at("data_offsets");
  if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
    fail_tensor(name, key, "data_offsets must be two non-negative integers, got " + brief(jo));
  const std::uint64_t begin = jo[0].get<std::uint64_t>(), end = jo[1].get<std::uint64_t>();
  if (begin > end)
    fail_tensor(name, key, MOEKIT_MSG("has data_offsets [" << begin << ", " << end << "] with begin > end"));
  if (end > buffer_size)
    fail_tensor(name, key,
                MOEKIT_MSG("has data_offsets [" << begin << ", " << end << "] past the end of the " << buffer_size
                                                << "-byte data buffer"));
  info.begin = static_cast<std::size_t>(begin);
  info.end = static_cast<std::size_t>(end);

  std::int64_t numel = 0;
  try {
    numel = shape_numel(info.shape);
  } catch (const std::invalid_argument&) {
    fail_tensor(name, key, "has shape " + shape_str(info.shape) + " whose element count overflows");
  }
  // Sub-byte types (F4, F6_*) pack elements with no padding, as the reference does: the bit
  // count must be a whole number of bytes (F4: an even element count).
  const auto un = static_cast<std::uint64_t>(numel);
  if (un > UINT64_MAX / spec->bits)
    fail_tensor(name, key, "has shape " + shape_str(info.shape) + " whose byte size overflows");
  const std::uint64_t bits = un * spec->bits;
  if (bits % 8 != 0)
    fail_tensor(name, key,
                MOEKIT_MSG("has shape " << shape_str(info.shape) << " of " << info.dtype_name << " (" << spec->bits
                                        << " bits each), not a whole number of bytes"));
  if (end - begin != bits / 8)
    fail_tensor(name, key,
                MOEKIT_MSG("has " << end - begin << " bytes but shape " << shape_str(info.shape) << " of "
                                  << info.dtype_name << " needs " << bits / 8));
  return info;
}

// No two non-empty byte ranges overlap: sorted by start, each starts at or after the last end.
void check_overlaps(const std::string& name, const std::vector<TensorInfo>& tensors) {
  std::vector<const TensorInfo*> order;
  for (const TensorInfo& t : tensors)
    if (t.end > t.begin) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (order[i]->begin < order[i - 1]->end)
      fail(name,
           MOEKIT_MSG("tensors '" << order[i - 1]->name << "' [" << order[i - 1]->begin << ", "
                                  << order[i - 1]->end << ") and '" << order[i]->name << "' ["
                                  << order[i]->begin << ", " << order[i]->end << ") overlap"));
  }
}

}  // namespace

void SafetensorsFile::parse(const std::string& name) {
  if (size_ < 8) fail(name, MOEKIT_MSG("file is " << size_ << " bytes, shorter than the 8-byte header length"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base_[i];
  if (n > size_ - 8)
    fail(name, MOEKIT_MSG("header length " << n << " runs past the end of the file (" << size_ << " bytes)"));
  if (n > kMaxHeader)
    fail(name, MOEKIT_MSG("header length " << n << " exceeds the limit of " << kMaxHeader << " bytes"));
  data_start_ = 8 + static_cast<std::size_t>(n);
  const std::size_t buffer_size = size_ - data_start_;

  const Json root = parse_header_json(name, reinterpret_cast<const char*>(base_ + 8), static_cast<std::size_t>(n));
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    const Json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) fail(name, "__metadata__ must be an object of strings, got " + brief(v));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(name, "__metadata__ value for \"" + m.key() + "\" must be a string, got " + brief(m.value()));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TensorInfo info = parse_entry(name, key, v, buffer_size, path_);
    index_.emplace(key, tensors_.size());
    tensors_.push_back(std::move(info));
  }
  check_overlaps(name, tensors_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const TensorInfo& t : tensors_) out.push_back(t.name);
  return out;
}

bool SafetensorsFile::contains(const std::string& name) const noexcept {
  return index_.count(name) != 0;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw std::out_of_range(
        MOEKIT_MSG("[moekit::safetensors] " << path_ << ": no tensor named '" << name << "'"));
  return tensors_[it->second];
}

const std::uint8_t* SafetensorsFile::bytes(const std::string& name) const {
  return base_ + data_start_ + info(name).begin;
}

void SafetensorsFile::read(const std::string& name, void* dst) const {
  const TensorInfo& t = info(name);
  const std::size_t n = t.end - t.begin;
  if (fd_ < 0) {
    std::memcpy(dst, base_ + data_start_ + t.begin, n);
    return;
  }
  std::size_t done = 0;
  while (done < n) {
    const ssize_t r =
        ::pread(fd_, static_cast<char*>(dst) + done, n - done, static_cast<off_t>(data_start_ + t.begin + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail_tensor(path_, name, MOEKIT_MSG("cannot be read (" << (r < 0 ? std::strerror(errno) : "end of file") << ")"));
    done += static_cast<std::size_t>(r);
  }
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const TensorInfo& t = info(name);
  if (!t.dtype)
    fail_tensor(
        path_, name,
        MOEKIT_MSG("has dtype " << t.dtype_name << ", which moekit cannot compute on (supported: "
                                << kComputable << ")"));
  return TensorView(static_cast<const void*>(base_ + data_start_ + t.begin), t.shape, *t.dtype);
}

// --- Checkpoint --------------------------------------------------------------------------------

namespace {

[[noreturn]] void ckpt_fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(MOEKIT_MSG("[moekit::Checkpoint] " << path << ": " << what));
}

}  // namespace

std::shared_ptr<const Checkpoint> Checkpoint::from_file(std::shared_ptr<const SafetensorsFile> file) {
  auto ck = std::make_shared<Checkpoint>();
  ck->path_ = file->path();
  for (const std::string& name : file->names()) ck->where_.emplace(name, 0);
  ck->files_.push_back(std::move(file));
  return ck;
}

std::shared_ptr<const Checkpoint> Checkpoint::open(const std::string& path) {
  namespace fs = std::filesystem;
  auto ck = std::make_shared<Checkpoint>();
  ck->path_ = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) ckpt_fail(path, "no such file or folder");

  const auto add_file = [&](const std::string& file) {
    const std::size_t idx = ck->files_.size();
    ck->files_.push_back(SafetensorsFile::open(file));
    for (const std::string& name : ck->files_.back()->names()) {
      const auto [it, inserted] = ck->where_.emplace(name, idx);
      if (!inserted)
        ckpt_fail(path, "tensor '" + name + "' is in two shards: " +
                            ck->files_[it->second]->path() + " and " + file);
    }
  };

  if (fs::is_regular_file(st)) {
    add_file(path);
    return ck;
  }
  if (!fs::is_directory(st)) ckpt_fail(path, "not a file or folder");

  const fs::path dir(path);
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    std::ifstream in(index_path, std::ios::binary);
    if (!in) ckpt_fail(ip, "cannot open");
    std::ostringstream ss;
    ss << in.rdbuf();
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(ss.str());
    } catch (const nlohmann::json::exception& e) {
      ckpt_fail(ip, MOEKIT_MSG("not valid JSON: " << e.what()));
    }
    if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
      ckpt_fail(ip, "must be a JSON object with a \"weight_map\" object");
    const nlohmann::json& wm = index.at("weight_map");
    std::set<std::string> shards;
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      if (!it.value().is_string())
        ckpt_fail(ip, "weight_map entry for '" + it.key() + "' must be a file name");
      const std::string shard = it.value().get<std::string>();
      const fs::path rel(shard);
      bool escapes = shard.empty() || rel.is_absolute();
      for (const fs::path& part : rel)
        if (part == "..") escapes = true;
      if (escapes)
        ckpt_fail(ip, "weight_map places '" + it.key() + "' in '" + shard +
                          "', which is not inside the folder");
      shards.insert(shard);
    }
    std::map<std::string, std::size_t> shard_index;
    for (const std::string& shard : shards) {
      const fs::path file = dir / shard;
      if (!fs::is_regular_file(file, ec))
        ckpt_fail(ip, "lists shard '" + shard + "', which does not exist (" + file.string() + ")");
      shard_index[shard] = ck->files_.size();
      add_file(file.string());
    }
    for (auto it = wm.begin(); it != wm.end(); ++it) {
      const std::string shard = it.value().get<std::string>();
      const auto w = ck->where_.find(it.key());
      if (w == ck->where_.end() || w->second != shard_index.at(shard))
        ckpt_fail(ip, "places tensor '" + it.key() + "' in shard '" + shard +
                          "', which does not contain it");
    }
    return ck;
  }

  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".safetensors" && it->is_regular_file(ec))
      files.push_back(it->path().string());
  }
  if (ec) ckpt_fail(path, MOEKIT_MSG("cannot list folder (" << ec.message() << ")"));
  if (files.empty())
    ckpt_fail(path, "folder has no *.safetensors files and no model.safetensors.index.json");
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) add_file(f);
  return ck;
}

bool Checkpoint::contains(const std::string& name) const noexcept {
  return where_.count(name) != 0;
}

const SafetensorsFile& Checkpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end())
    throw std::out_of_range(
        MOEKIT_MSG("[moekit::Checkpoint] " << path_ << ": no tensor named '" << name << "'"));
  return *files_[it->second];
}

const TensorInfo& Checkpoint::info(const std::string& name) const { return file_of(name).info(name); }

const std::uint8_t* Checkpoint::bytes(const std::string& name) const { return file_of(name).bytes(name); }

void Checkpoint::read(const std::string& name, void* dst) const { file_of(name).read(name, dst); }

TensorView Checkpoint::view(const std::string& name) const { return file_of(name).view(name); }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, idx] : where_) out.push_back(name);
  return out;
}

}  // namespace moekit

namespace moekit {

SafetensorsWriter::SafetensorsWriter(std::string path, std::vector<Entry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_ + ".partial"), entries_(std::move(entries)) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const Entry& e : entries_) {
    if (header.contains(e.name)) fail_tensor(path_, e.name, "appears twice in the entries to write");
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  file_size_ = 8 + text.size() + offset;
  out_ = std::fopen(tmp_.c_str(), "wb");
  if (!out_) fail(tmp_, MOEKIT_MSG("cannot create (" << std::strerror(errno) << ")"));
  unsigned char len[8];
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, out_) != 8 || std::fwrite(text.data(), 1, text.size(), out_) != text.size())
    fail(tmp_, MOEKIT_MSG("cannot write the header (" << std::strerror(errno) << ")"));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (out_) {
    std::fclose(out_);
    std::remove(tmp_.c_str());
  }
}

void SafetensorsWriter::write(const void* data, std::size_t nbytes) {
  if (!out_) fail(path_, "write after commit");
  if (next_ >= entries_.size()) fail(path_, "more tensors written than the header lists");
  const Entry& e = entries_[next_];
  if (nbytes != e.nbytes)
    fail_tensor(path_, e.name, MOEKIT_MSG("is given " << nbytes << " bytes, the header says " << e.nbytes));
  if (nbytes && std::fwrite(data, 1, nbytes, out_) != nbytes)
    fail_tensor(tmp_, e.name, MOEKIT_MSG("cannot be written (" << std::strerror(errno) << ")"));
  ++next_;
}

void SafetensorsWriter::commit() {
  if (!out_) fail(path_, "committed twice");
  if (next_ != entries_.size())
    fail(path_, MOEKIT_MSG("commit after " << next_ << " of " << entries_.size() << " tensors"));
  const bool ok = std::fflush(out_) == 0 && ::fsync(fileno(out_)) == 0;
  const int err = errno;
  std::fclose(out_);
  out_ = nullptr;
  if (!ok) {
    std::remove(tmp_.c_str());
    fail(tmp_, MOEKIT_MSG("cannot flush (" << std::strerror(err) << ")"));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e2 = errno;
    std::remove(tmp_.c_str());
    fail(path_, MOEKIT_MSG("cannot rename " << tmp_ << " onto it (" << std::strerror(e2) << ")"));
  }
}

}  // namespace moekit
