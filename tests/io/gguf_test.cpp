// The GGUF reader (moekit/gguf.hpp): metadata of every type, tensor infos, alignment, split models,
// and a named error for each way a file can be wrong.
#include "moekit/gguf.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/gguf_writer.hpp"
#include "io/safetensors_writer.hpp"
#include "moekit/model.hpp"

namespace moekit {
namespace {

using testing::GgufImage;

std::shared_ptr<const GgufFile> parse(const GgufImage& g) { return GgufFile::from_bytes(g.image(), "t.gguf"); }

// The message `parse` throws for `bytes`, or "" if it parses.
std::string error_of(const std::vector<std::uint8_t>& bytes) {
  try {
    GgufFile::from_bytes(bytes, "bad.gguf");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

GgufImage small() {
  GgufImage g;
  g.str("general.architecture", "qwen3moe").u32("qwen3moe.expert_count", 4);
  g.f32_tensor("a", {4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  g.f32_tensor("b", {3}, {9, 10, 11});
  return g;
}

TEST(Gguf, ReadsEveryMetadataType) {
  GgufImage g;
  g.scalar<std::uint8_t>("u8", 0, 200).scalar<std::int8_t>("i8", 1, -5).scalar<std::uint16_t>("u16", 2, 60000);
  g.scalar<std::int16_t>("i16", 3, -300).u32("u32", 4000000000u).i32("i32", -7).f32("f32", 0.5f).boolean("b", true);
  g.str("s", "qwen3moe").scalar<std::uint64_t>("u64", 10, 1ull << 40).scalar<std::int64_t>("i64", 11, -(1ll << 40));
  g.scalar<double>("f64", 12, 0.25).i32s("ints", {3, -1, 4}).strs("strs", {"a", "", "ccc"});
  // An array of arrays: [[1, 2], []] of u8.
  GgufImage::put_string(g.kv, "nested");
  GgufImage::put<std::uint32_t>(g.kv, 9);
  GgufImage::put<std::uint32_t>(g.kv, 9);
  GgufImage::put<std::uint64_t>(g.kv, 2);
  for (const std::vector<std::uint8_t>& inner : {std::vector<std::uint8_t>{1, 2}, std::vector<std::uint8_t>{}}) {
    GgufImage::put<std::uint32_t>(g.kv, 0);
    GgufImage::put<std::uint64_t>(g.kv, inner.size());
    for (const std::uint8_t x : inner) GgufImage::put(g.kv, x);
  }
  ++g.kv_count;
  const auto f = parse(g);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get("u8").as_int(), 200);
  EXPECT_EQ(f->get("i8").as_int(), -5);
  EXPECT_EQ(f->get("u16").as_int(), 60000);
  EXPECT_EQ(f->get("i16").as_int(), -300);
  EXPECT_EQ(f->get("u32").as_int(), 4000000000ll);
  EXPECT_EQ(f->get("i32").as_int(), -7);
  EXPECT_EQ(f->get("f32").as_float(), 0.5);
  EXPECT_TRUE(f->get("b").as_bool());
  EXPECT_EQ(f->get("s").as_string(), "qwen3moe");
  EXPECT_EQ(f->get("u64").as_int(), 1ll << 40);
  EXPECT_EQ(f->get("i64").as_int(), -(1ll << 40));
  EXPECT_EQ(f->get("f64").as_float(), 0.25);
  EXPECT_EQ(f->get("ints").as_ints(), (std::vector<std::int64_t>{3, -1, 4}));
  EXPECT_EQ(f->get("strs").size(), 3u);
  EXPECT_EQ(f->get("strs").at(2).as_string(), "ccc");
  EXPECT_EQ(f->get("strs").at(1).as_string(), "");
  const GgufValue& nested = f->get("nested");
  EXPECT_EQ(nested.element_type(), GgufType::array);
  EXPECT_EQ(nested.at(0).as_ints(), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(nested.at(1).size(), 0u);
  EXPECT_EQ(f->keys().front(), "u8");
  EXPECT_EQ(f->get("ints").describe(), "arr[i32, 3]");
  EXPECT_THROW(f->get("s").as_int(), std::invalid_argument);
  EXPECT_THROW(f->get("ints").at(3), std::out_of_range);
  EXPECT_THROW(f->get("missing"), std::out_of_range);
}

TEST(Gguf, TensorsLieAtAlignedOffsetsInTheDataSection) {
  GgufImage g = small();
  g.version = 2;
  g.alignment = 64;
  g.u32("general.alignment", 64);
  const auto f = parse(g);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  const GgufTensorInfo* a = f->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->ne, (std::vector<std::int64_t>{4, 2}));
  EXPECT_EQ(a->nbytes, 32u);
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[5], 6.0f);
  const GgufTensorInfo* b = f->find("b");
  EXPECT_EQ(b->offset, 64u);
  EXPECT_EQ(reinterpret_cast<const float*>(b->data)[2], 11.0f);
  EXPECT_EQ(f->find("c"), nullptr);
}

TEST(Gguf, QuantizedTensorBytesComeFromTheBlockSize) {
  GgufImage g;
  g.tensor("q", {64, 3}, 12 /* q4_K: 256 per 144 bytes */, std::vector<std::uint8_t>(3 * 144));
  EXPECT_NE(error_of(g.image()).find("not a multiple of q4_K's block of 256"), std::string::npos);
  g.tensors[0].ne = {256, 3};
  const auto f = parse(g);
  EXPECT_EQ(f->find("q")->nbytes, 3u * 144u);
}

// A block_count far beyond any model (a fuzzer's find: listing the MoE layers of 2^28 layers
// allocated 2 GB) is a named error, as config.json's num_hidden_layers is.
TEST(Gguf, BlockCountIsBounded) {
  for (const std::uint32_t layers : {std::uint32_t{0}, static_cast<std::uint32_t>(kMaxLayers) + 1, 1u << 28}) {
    GgufImage g;
    g.str("general.architecture", "qwen3moe").u32("qwen3moe.block_count", layers);
    const auto model = GgufModel::from_file(parse(g));
    try {
      (void)gguf_config(*model);
      ADD_FAILURE() << layers << " layers accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("'qwen3moe.block_count' is " + std::to_string(layers) + " (expected 1 to"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Gguf, BadFilesGiveNamedErrors) {
  const std::vector<std::uint8_t> good = small().image();
  const auto expect = [](const std::vector<std::uint8_t>& bytes, const std::string& needle) {
    const std::string e = error_of(bytes);
    EXPECT_NE(e.find(needle), std::string::npos) << "wanted '" << needle << "', got '" << e << "'";
    EXPECT_NE(e.find("bad.gguf"), std::string::npos) << e;
  };
  expect({}, "not a GGUF file");
  expect({'G', 'G', 'U', 'F'}, "truncated: version");
  std::vector<std::uint8_t> b = good;
  b[4] = 1;
  expect(b, "version 1 is not read");
  b = good;
  b[4] = 0, b[7] = 3;  // 0x03000000: a big-endian 3
  expect(b, "big-endian");
  b = good;
  b[4] = 9;
  expect(b, "GGUF version 9 is not 2 or 3");
  // Truncations at every point of the header and data (the last 20 bytes are the padding after
  // the last tensor, which a file may lack).
  for (std::size_t n = 8; n < good.size() - 20; n += 7) {
    const std::string e = error_of(std::vector<std::uint8_t>(good.begin(), good.begin() + static_cast<long>(n)));
    EXPECT_NE(e.find("truncated"), std::string::npos) << n << ": " << e;
  }
  // A huge tensor count / metadata count.
  b = good;
  b[15] = 0x7f;
  expect(b, "tensor count");
  b = good;
  b[23] = 0x7f;
  expect(b, "metadata count");
  {
    GgufImage g = small();
    g.str("general.architecture", "again");
    expect(g.image(), "duplicate metadata 'general.architecture'");
  }
  {
    GgufImage g = small();
    g.f32_tensor("a", {1}, {0});
    expect(g.image(), "duplicate tensor 'a'");
  }
  {
    GgufImage g = small();
    g.u32("general.alignment", 24);
    expect(g.image(), "not a power of two");
  }
  {
    GgufImage g = small();
    g.i32("general.alignment", 32);
    expect(g.image(), "expected u32");
  }
  {
    GgufImage g = small();
    g.tensors[1].offset = 16;
    expect(g.image(), "not a multiple of the alignment 32");
  }
  {
    GgufImage g = small();
    g.tensors[1].offset = 0;
    expect(g.image(), "overlap");
  }
  {
    GgufImage g = small();
    g.tensors[1].offset = 1 << 20;
    const std::vector<std::uint8_t> full = g.image();
    // The file ends before the tensor's bytes do.
    expect(std::vector<std::uint8_t>(full.begin(), full.end() - 64), "ends past the data section");
  }
  {
    GgufImage g = small();
    g.tensors[0].type = 4;  // q4_2: removed from ggml
    expect(g.image(), "unknown ggml type 4");
  }
  {
    GgufImage g = small();
    g.tensors[0].ne = {4, 2, 1, 1, 1};
    expect(g.image(), "5 dimensions");
  }
  {
    GgufImage g = small();
    g.tensors[0].ne = {-4, 2};
    expect(g.image(), "negative extent");
  }
  {
    GgufImage g = small();
    g.tensors[0].ne = {1ll << 40, 1ll << 40};
    expect(g.image(), "more elements than fit in 64 bits");
  }
  {
    GgufImage g;
    g.scalar<std::uint32_t>("bad type", 13, 0);
    expect(g.image(), "unknown value type 13");
  }
  {
    GgufImage g;
    GgufImage::put_string(g.kv, "long string");
    GgufImage::put<std::uint32_t>(g.kv, 8);
    GgufImage::put<std::uint64_t>(g.kv, 1ull << 62);
    ++g.kv_count;
    expect(g.image(), "truncated: metadata 'long string', a string of 4611686018427387904 bytes");
  }
  {
    GgufImage g;
    GgufImage::put_string(g.kv, "huge array");
    GgufImage::put<std::uint32_t>(g.kv, 9);
    GgufImage::put<std::uint32_t>(g.kv, 8);
    GgufImage::put<std::uint64_t>(g.kv, 1ull << 60);
    ++g.kv_count;
    expect(g.image(), "claims 1152921504606846976 elements");
  }
  {
    // Arrays nested deeper than 8 levels.
    GgufImage g;
    GgufImage::put_string(g.kv, "deep");
    GgufImage::put<std::uint32_t>(g.kv, 9);
    for (int i = 0; i < 12; ++i) {
      GgufImage::put<std::uint32_t>(g.kv, 9);
      GgufImage::put<std::uint64_t>(g.kv, 1);
    }
    ++g.kv_count;
    expect(g.image(), "nest deeper than 8");
  }
}

// A split model: three parts written as gguf-split names them, opened from any part.
class GgufSplit : public ::testing::Test {
 protected:
  void SetUp() override {
    write(0, 3, "t0");
    write(1, 3, "t1");
    write(2, 3, "t2");
  }
  // Part `no` (0-based) saying split.count `count`, under the name of part no + 1 of 3.
  void write(int no, int count, const std::string& tensor, int tensors_count = 3) {
    GgufImage g;
    g.u16("split.no", static_cast<std::uint16_t>(no)).u16("split.count", static_cast<std::uint16_t>(count));
    if (no == 0) g.str("general.architecture", "qwen3moe").i32("split.tensors.count", tensors_count);
    g.f32_tensor(tensor, {2}, {static_cast<float>(no), 1.0f});
    const std::vector<std::uint8_t> img = g.image();
    std::ofstream(path(no + 1, 3), std::ios::binary)
        .write(reinterpret_cast<const char*>(img.data()), static_cast<std::streamsize>(img.size()));
  }
  std::string path(int no, int count) const {
    char buf[64];
    std::snprintf(buf, sizeof buf, "/m-%05d-of-%05d.gguf", no, count);
    return dir_.path().string() + buf;
  }
  testing::TempDir dir_{"gguf_split"};
};

TEST_F(GgufSplit, OpensAsOneModelFromAnyPart) {
  for (int part = 1; part <= 3; ++part) {
    const auto m = GgufModel::open(path(part, 3));
    EXPECT_EQ(m->files().size(), 3u);
    EXPECT_EQ(m->get("general.architecture").as_string(), "qwen3moe");
    ASSERT_NE(m->find("t2"), nullptr);
    EXPECT_EQ(reinterpret_cast<const float*>(m->find("t2")->data)[0], 2.0f);
    EXPECT_EQ(m->find("t2")->file, path(3, 3));
    EXPECT_EQ(m->tensors().size(), 3u);
  }
}

TEST_F(GgufSplit, NamesWhatIsWrong) {
  const auto error = [&](int part) -> std::string {
    try {
      GgufModel::open(path(part, 3));
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "";
  };
  std::filesystem::remove(path(2, 3));
  EXPECT_NE(error(1).find("missing: part 2 of the 3-part model"), std::string::npos) << error(1);
  write(1, 3, "t0");
  EXPECT_NE(error(1).find("is also in"), std::string::npos) << error(1);
  write(1, 3, "t1");
  write(0, 3, "t0", 5);
  EXPECT_NE(error(3).find("split.tensors.count 5"), std::string::npos) << error(3);
  write(0, 3, "t0");
  write(2, 4, "t2");
  EXPECT_NE(error(1).find("split.count 4"), std::string::npos) << error(1);
  write(2, 3, "t2");
  write(1, 3, "t1");
  std::filesystem::copy_file(path(1, 3), dir_.file("renamed.gguf"));
  try {
    GgufModel::open(dir_.file("renamed.gguf"));
    ADD_FAILURE() << "a renamed part opened";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("does not end in '-00001-of-00003.gguf'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moekit
