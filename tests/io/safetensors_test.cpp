#include "moekit/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/safetensors_writer.hpp"

namespace moekit {
namespace {

using testing::safetensors_image;
using testing::safetensors_image_raw;
using testing::SafetensorsEntry;
using testing::TempDir;
using testing::to_bytes;
using testing::write_file;
using testing::write_safetensors;
using testing::write_text;

// Asserts `fn` throws std::runtime_error whose message contains every one of `parts`.
template <typename Fn>
void expect_runtime_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

std::vector<std::uint16_t> bf16s(const std::vector<float>& v) {
  std::vector<std::uint16_t> out;
  for (float x : v) out.push_back(f32_to_bf16(x));
  return out;
}
std::vector<std::uint16_t> f16s(const std::vector<float>& v) {
  std::vector<std::uint16_t> out;
  for (float x : v) out.push_back(f32_to_f16(x));
  return out;
}

std::vector<SafetensorsEntry> sample_entries() {
  return {
      {"w.f32", "F32", {2, 3}, to_bytes(std::vector<float>{1, 2, 3, 4, 5, -6})},
      {"w.bf16", "BF16", {3}, to_bytes(bf16s({0.5f, -1.f, 2.f}))},
      {"w.f16", "F16", {1, 2}, to_bytes(f16s({0.25f, 8.f}))},
      {"ids", "I32", {4}, to_bytes(std::vector<std::int32_t>{7, -1, 0, 3})},
      {"bytes", "U8", {}, {42}},
      {"empty", "F32", {0, 4}, {}},
  };
}

void expect_view_bytes(const TensorView& v, const SafetensorsEntry& e) {
  ASSERT_EQ(v.shape(), e.shape);
  ASSERT_EQ(v.nbytes(), e.bytes.size());
  if (!e.bytes.empty()) {
    EXPECT_EQ(std::memcmp(v.data(), e.bytes.data(), e.bytes.size()), 0);
  }
}

TEST(SafetensorsTest, ValidFileReadsBackEqual) {
  TempDir dir("st_valid");
  const auto entries = sample_entries();
  const std::string path = dir.file("model.safetensors");
  write_safetensors(path, entries, {{"format", "pt"}, {"note", "hi"}});
  const auto image = safetensors_image(entries, {{"format", "pt"}, {"note", "hi"}});
  for (const auto& f : {SafetensorsFile::open(path), SafetensorsFile::from_bytes(image, path)}) {
    EXPECT_EQ(f->path(), path);
    EXPECT_EQ(f->file_size(), image.size());
    EXPECT_EQ(f->names(),
              (std::vector<std::string>{"w.f32", "w.bf16", "w.f16", "ids", "bytes", "empty"}));
    EXPECT_EQ(f->metadata(),
              (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hi"}}));
    for (const SafetensorsEntry& e : entries) {
      SCOPED_TRACE(e.name);
      ASSERT_TRUE(f->contains(e.name));
      const TensorInfo& info = f->info(e.name);
      EXPECT_EQ(info.name, e.name);
      EXPECT_EQ(info.dtype_name, e.dtype);
      EXPECT_EQ(info.end - info.begin, e.bytes.size());
      EXPECT_EQ(info.file, path);
      expect_view_bytes(f->view(e.name), e);
      if (!e.bytes.empty()) {
        EXPECT_EQ(std::memcmp(f->bytes(e.name), e.bytes.data(), e.bytes.size()), 0);
      }
    }
    EXPECT_EQ(f->info("w.f32").dtype, DType::f32);
    EXPECT_EQ(f->info("w.bf16").dtype, DType::bf16);
    EXPECT_EQ(f->info("w.f16").dtype, DType::f16);
    EXPECT_EQ(f->info("ids").dtype, DType::i32);
    EXPECT_EQ(f->info("bytes").dtype, DType::u8);
    EXPECT_EQ(f->info("w.bf16").element_size, 2u);
    EXPECT_EQ(f->view("w.f32").dtype(), DType::f32);
    EXPECT_FALSE(f->contains("nope"));
    EXPECT_THROW(f->info("nope"), std::out_of_range);
    EXPECT_THROW(f->view("nope"), std::out_of_range);
    EXPECT_THROW(f->bytes("nope"), std::out_of_range);
  }
  // Values through the dtype conversions.
  const auto f = SafetensorsFile::open(path);
  const Tensor bf = to_dtype(f->view("w.bf16"), DType::f32);
  EXPECT_EQ(bf.data_as<float>()[1], -1.f);
  const Tensor h = to_dtype(f->view("w.f16"), DType::f32);
  EXPECT_EQ(h.data_as<float>()[1], 8.f);
}

TEST(SafetensorsTest, EmptyDataBufferAndNoTensors) {
  TempDir dir("st_empty");
  const std::string path = dir.file("e.safetensors");
  write_safetensors(path, {{"z", "F32", {0}, {}}});
  const auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f->view("z").numel(), 0);
  write_file(path, safetensors_image_raw("{}", {}));
  EXPECT_TRUE(SafetensorsFile::open(path)->names().empty());
  write_file(path, safetensors_image_raw("{\"__metadata__\": {}}", {}));
  EXPECT_TRUE(SafetensorsFile::open(path)->metadata().empty());
}

TEST(SafetensorsTest, NonComputableDtypeListedButViewThrows) {
  const std::string name = "fp8.safetensors";
  const auto f = SafetensorsFile::from_bytes(safetensors_image({{"a", "F32", {1}, to_bytes(std::vector<float>{1})},
                                                                {"w8", "F8_E5M2", {2, 2}, {1, 2, 3, 4}},
                                                                {"e4m3", "F8_E4M3", {2}, {0x38, 0xC4}},
                                                                {"packed", "F4", {6}, {0x12, 0x34, 0x56}},
                                                                {"c", "C64", {1}, std::vector<std::uint8_t>(8)}}),
                                             name);
  const TensorInfo& info = f->info("w8");
  EXPECT_EQ(info.dtype_name, "F8_E5M2");
  EXPECT_FALSE(info.dtype.has_value());
  EXPECT_EQ(info.element_size, 1u);
  EXPECT_EQ(f->bytes("w8")[3], 4);
  EXPECT_EQ(f->info("packed").element_size, 0u);
  EXPECT_EQ(f->bytes("packed")[2], 0x56);
  try {
    f->view("w8");
    ADD_FAILURE() << "expected runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[moekit::safetensors] fp8.safetensors: tensor 'w8' has dtype F8_E5M2, which moekit "
              "cannot compute on "
              "(supported: F32, BF16, F16, I32, U8, U32, F8_E4M3, F8_E8M0)");
  }
  // E4M3 (the FP8 releases' weights) is read: 0x38 = 1.0, 0xC4 = -3.0.
  const TensorView e4m3 = f->view("e4m3");
  EXPECT_EQ(e4m3.dtype(), DType::f8_e4m3);
  EXPECT_EQ(to_dtype(e4m3, DType::f32).data_as<float>()[0], 1.0f);
  EXPECT_EQ(to_dtype(e4m3, DType::f32).data_as<float>()[1], -3.0f);
  expect_runtime_error([&] { f->view("packed"); }, {name, "'packed'", "F4"});
}

TEST(SafetensorsTest, DtypeNamesAreTheFormats) {
  const auto& names = safetensors_dtype_names();
  for (const char* n : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16",
                        "BF16", "I32", "U32", "F32", "F64", "I64", "U64", "F4"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

struct BadCase {
  const char* what;
  std::vector<std::uint8_t> bytes;
  std::vector<std::string> parts;  // besides the file name
};

std::vector<std::uint8_t> with_header(const std::string& header, std::size_t data_bytes = 16) {
  return safetensors_image_raw(header, std::vector<std::uint8_t>(data_bytes, 0));
}

std::vector<BadCase> bad_cases() {
  std::vector<std::uint8_t> huge = with_header("{}");
  huge[0] = 0;
  huge[7] = 0x80;  // 2^63
  std::vector<std::uint8_t> past_end = with_header("{}");
  past_end[0] = 0xff;
  const std::string ok_b = R"("b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]})";
  return {
      {"empty file", {}, {"shorter than the 8-byte header length"}},
      {"7 bytes", {1, 0, 0, 0, 0, 0, 0}, {"shorter than the 8-byte header length"}},
      {"header length past end", past_end, {"header length 255 runs past the end"}},
      {"header length 2^63", huge, {"header length 9223372036854775808 runs past the end"}},
      {"not JSON", with_header("{\"a\": "), {"not valid JSON"}},
      {"not JSON at all", with_header("hello"), {"not valid JSON"}},
      {"invalid UTF-8", with_header("{\"\xff\": 1}"), {"not valid JSON"}},
      {"JSON array", with_header("[1, 2]"), {"must be a JSON object, got array"}},
      {"entry not an object", with_header(R"({"a": [1]})"), {"'a'", "must be an object"}},
      {"missing dtype",
       with_header(R"({"a": {"shape": [2], "data_offsets": [0, 8]}})"),
       {"'a'", "missing field \"dtype\""}},
      {"missing shape",
       with_header(R"({"a": {"dtype": "F32", "data_offsets": [0, 8]}})"),
       {"'a'", "missing field \"shape\""}},
      {"missing offsets",
       with_header(R"({"a": {"dtype": "F32", "shape": [2]}})"),
       {"'a'", "missing field \"data_offsets\""}},
      {"extra field",
       with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "x": 1}})"),
       {"'a'", "unexpected field \"x\""}},
      {"dtype not a string",
       with_header(R"({"a": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}})"),
       {"'a'", "dtype"}},
      {"unknown dtype F7",
       with_header(R"({"a": {"dtype": "F7", "shape": [2], "data_offsets": [0, 8]}})"),
       {"'a'", "unknown dtype \"F7\""}},
      {"lower-case dtype",
       with_header(R"({"a": {"dtype": "f32", "shape": [2], "data_offsets": [0, 8]}})"),
       {"'a'", "unknown dtype \"f32\""}},
      {"negative shape",
       with_header(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})"),
       {"'a'", "non-negative integers"}},
      {"float shape",
       with_header(R"({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}})"),
       {"'a'", "non-negative integers"}},
      {"shape not array",
       with_header(R"({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})"),
       {"'a'", "non-negative integers"}},
      {"shape above int64",
       with_header(
           R"({"a": {"dtype": "F32", "shape": [18446744073709551615], "data_offsets": [0, 8]}})"),
       {"'a'", "non-negative integers"}},
      {"numel overflow",
       with_header(
           R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})"),
       {"'a'", "overflows"}},
      {"byte size overflow",
       with_header(
           R"({"a": {"dtype": "F64", "shape": [4611686018427387904], "data_offsets": [0, 8]}})"),
       {"'a'", "overflows"}},
      {"offsets out of range",
       with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})"),
       {"'a'", "past the end of the 16-byte data buffer"}},
      {"offsets begin > end",
       with_header(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})"),
       {"'a'", "begin > end"}},
      {"negative offset",
       with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})"),
       {"'a'", "two non-negative integers"}},
      {"three offsets",
       with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}})"),
       {"'a'", "two non-negative integers"}},
      {"bytes != numel * size",
       with_header(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})"),
       {"'a'", "has 8 bytes but shape (3,) of F32 needs 12"}},
      {"odd F4 count",
       with_header(R"({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})"),
       {"'a'", "not a whole number of bytes"}},
      {"overlapping",
       with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}, )" + ok_b +
                   "}"),
       {"'a'", "'b'", "overlap"}},
      {"identical ranges",
       with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}, )" + ok_b +
                   "}"),
       {"'a'", "'b'", "overlap"}},
      {"duplicate tensor", with_header("{" + ok_b + ", " + ok_b + "}"), {"duplicate key \"b\""}},
      {"metadata not an object",
       with_header(R"({"__metadata__": "x"})"),
       {"__metadata__ must be an object"}},
      {"metadata non-string value",
       with_header(R"({"__metadata__": {"k": 1}})"),
       {"__metadata__ value for \"k\""}},
      {"metadata null value",
       with_header(R"({"__metadata__": {"k": null}})"),
       {"__metadata__ value for \"k\""}},
      {"deep nesting",
       with_header("{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}"),
       {"nests deeper"}},
  };
}

TEST(SafetensorsTest, MalformedFilesThrowNamingFileAndTensor) {
  TempDir dir("st_bad");
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("bad_file.safetensors");
    write_file(path, c.bytes);
    std::vector<std::string> parts = c.parts;
    parts.push_back("[moekit::safetensors] " + path + ": ");
    expect_runtime_error([&] { SafetensorsFile::open(path); }, parts);
    parts.back() = "[moekit::safetensors] in_memory.safetensors: ";
    expect_runtime_error([&] { SafetensorsFile::from_bytes(c.bytes, "in_memory.safetensors"); },
                         parts);
  }
  expect_runtime_error([&] { SafetensorsFile::open(dir.file("missing.safetensors")); },
                       {dir.file("missing.safetensors"), "cannot open"});
  expect_runtime_error([&] { SafetensorsFile::open(dir.path().string()); }, {dir.path().string()});
}

TEST(SafetensorsTest, HeaderLimitIs100MB) {
  // A header length just above the limit, with a file long enough to hold it, is refused before
  // any JSON parsing.
  std::vector<std::uint8_t> bytes(8 + 100'000'001, ' ');
  const std::uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  expect_runtime_error([&] { SafetensorsFile::from_bytes(std::move(bytes), "big.safetensors"); },
                       {"big.safetensors", "exceeds the limit of 100000000 bytes"});
}

// Every prefix of a valid file and every single-byte corruption either parses or throws
// runtime_error (under ASan this also proves no out-of-bounds reads).
TEST(SafetensorsTest, NoCrashOnCorruptBytes) {
  const auto good = safetensors_image({{"a", "F32", {2}, to_bytes(std::vector<float>{1, 2})},
                                       {"b", "I32", {1}, to_bytes(std::vector<std::int32_t>{3})}},
                                      {{"k", "v"}});
  for (std::size_t n = 0; n < good.size(); ++n) {
    std::vector<std::uint8_t> prefix(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      SafetensorsFile::from_bytes(prefix, "prefix");
    } catch (const std::runtime_error&) {
    }
  }
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (std::uint8_t v :
         {0x00, 0x01, 0x22, 0x2c, 0x2d, 0x30, 0x39, 0x5b, 0x5d, 0x7b, 0x7d, 0x80, 0xff}) {
      std::vector<std::uint8_t> b = good;
      b[i] = v;
      try {
        const auto f = SafetensorsFile::from_bytes(b, "corrupt");
        for (const std::string& name : f->names()) {
          const TensorInfo& info = f->info(name);
          EXPECT_LE(info.begin, info.end);
          EXPECT_LE(info.end, f->file_size());
          if (info.dtype) {
            EXPECT_EQ(f->view(name).nbytes(), info.end - info.begin);
          }
        }
      } catch (const std::runtime_error&) {
      }
    }
  }
}

// --- Checkpoint --------------------------------------------------------------------------------

SafetensorsEntry f32_entry(const std::string& name, std::vector<float> values) {
  return {name, "F32", {static_cast<std::int64_t>(values.size())}, to_bytes(values)};
}

const char* kIndex = R"({"metadata": {"total_size": 24}, "weight_map": {
  "layer.0.w": "model-00001-of-00002.safetensors",
  "layer.0.b": "model-00001-of-00002.safetensors",
  "layer.1.w": "model-00002-of-00002.safetensors"}})";

void write_two_shards(const TempDir& dir) {
  write_safetensors(dir.file("model-00001-of-00002.safetensors"),
                    {f32_entry("layer.0.w", {1, 2}), f32_entry("layer.0.b", {3})});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                    {f32_entry("layer.1.w", {4, 5, 6})});
}

TEST(CheckpointTest, ShardedFolderWithIndexRoutesToTheRightFile) {
  TempDir dir("ckpt_index");
  write_two_shards(dir);
  write_text(dir.file("model.safetensors.index.json"), kIndex);
  // A stray file beside the shards (Mistral repos ship consolidated.safetensors too) is ignored.
  write_safetensors(dir.file("consolidated.safetensors"), {f32_entry("layer.0.w", {9, 9})});
  const auto ck = Checkpoint::open(dir.path().string());
  EXPECT_EQ(ck->path(), dir.path().string());
  EXPECT_EQ(ck->files().size(), 2u);
  EXPECT_EQ(ck->names(), (std::vector<std::string>{"layer.0.b", "layer.0.w", "layer.1.w"}));
  EXPECT_EQ(ck->info("layer.0.w").file, dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(ck->info("layer.1.w").file, dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(ck->view("layer.1.w").data_as<const float>()[2], 6.f);
  EXPECT_EQ(ck->view("layer.0.w").data_as<const float>()[0], 1.f);
  EXPECT_EQ(ck->view("layer.0.b").data_as<const float>()[0], 3.f);
  EXPECT_TRUE(ck->contains("layer.0.b"));
  EXPECT_FALSE(ck->contains("layer.2.w"));
  EXPECT_THROW(ck->info("layer.2.w"), std::out_of_range);
  EXPECT_THROW(ck->view("layer.2.w"), std::out_of_range);
}

TEST(CheckpointTest, FolderWithoutIndexAndSingleFile) {
  TempDir dir("ckpt_noindex");
  write_two_shards(dir);
  const auto ck = Checkpoint::open(dir.path().string());
  ASSERT_EQ(ck->files().size(), 2u);
  EXPECT_EQ(ck->files()[0]->path(),
            dir.file("model-00001-of-00002.safetensors"));  // sorted by name
  EXPECT_EQ(ck->names().size(), 3u);
  EXPECT_EQ(ck->view("layer.1.w").numel(), 3);

  const auto single = Checkpoint::open(dir.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(single->names(), (std::vector<std::string>{"layer.1.w"}));
}

TEST(CheckpointTest, Errors) {
  {
    TempDir dir("ckpt_missing_shard");
    write_two_shards(dir);
    std::filesystem::remove(dir.file("model-00002-of-00002.safetensors"));
    write_text(dir.file("model.safetensors.index.json"), kIndex);
    expect_runtime_error(
        [&] { Checkpoint::open(dir.path().string()); },
        {"model.safetensors.index.json", "model-00002-of-00002.safetensors", "does not exist"});
  }
  {
    TempDir dir("ckpt_wrong_shard");
    write_two_shards(dir);
    std::string index = kIndex;
    const std::string from = "\"layer.0.b\": \"model-00001";
    index.replace(index.find(from), from.size(), "\"layer.0.b\": \"model-00002");
    write_text(dir.file("model.safetensors.index.json"), index);
    expect_runtime_error([&] { Checkpoint::open(dir.path().string()); },
                         {"model.safetensors.index.json", "'layer.0.b'",
                          "model-00002-of-00002.safetensors", "does not contain it"});
  }
  {
    TempDir dir("ckpt_index_names_absent_tensor");
    write_two_shards(dir);
    std::string index = kIndex;
    const std::string from = "\"layer.1.w\"";
    index.replace(index.find(from), from.size(), "\"layer.9.w\"");
    write_text(dir.file("model.safetensors.index.json"), index);
    expect_runtime_error([&] { Checkpoint::open(dir.path().string()); },
                         {"'layer.9.w'", "does not contain it"});
  }
  for (bool with_index : {false, true}) {
    TempDir dir("ckpt_dup");
    write_two_shards(dir);
    write_safetensors(dir.file("model-00002-of-00002.safetensors"),
                      {f32_entry("layer.1.w", {4, 5, 6}), f32_entry("layer.0.b", {3})});
    if (with_index) write_text(dir.file("model.safetensors.index.json"), kIndex);
    expect_runtime_error([&] { Checkpoint::open(dir.path().string()); },
                         {"'layer.0.b'", "two shards", "model-00001-of-00002.safetensors",
                          "model-00002-of-00002.safetensors"});
  }
  {
    TempDir dir("ckpt_empty");
    write_text(dir.file("README.md"), "nothing here");
    expect_runtime_error([&] { Checkpoint::open(dir.path().string()); },
                         {dir.path().string(), "no *.safetensors files"});
    expect_runtime_error([&] { Checkpoint::open(dir.file("nope")); },
                         {dir.file("nope"), "no such file or folder"});
  }
  {
    TempDir dir("ckpt_bad_index");
    write_two_shards(dir);
    const std::string index_path = dir.file("model.safetensors.index.json");
    for (const std::string bad :
         {"{not json", "[1]", "{\"weight_map\": 3}", "{\"weight_map\": {\"a\": 1}}",
          "{\"weight_map\": {\"a\": \"../x.safetensors\"}}",
          "{\"weight_map\": {\"a\": \"/etc/passwd\"}}"}) {
      SCOPED_TRACE(bad);
      write_text(index_path, bad);
      expect_runtime_error([&] { Checkpoint::open(dir.path().string()); }, {index_path});
    }
  }
  {
    TempDir dir("ckpt_bad_shard");
    write_two_shards(dir);
    write_file(dir.file("model-00002-of-00002.safetensors"), {1, 2, 3});
    expect_runtime_error(
        [&] { Checkpoint::open(dir.path().string()); },
        {"model-00002-of-00002.safetensors", "shorter than the 8-byte header length"});
  }
}

}  // namespace
}  // namespace moekit
