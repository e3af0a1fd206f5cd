#include "moekit/npy.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/safetensors_writer.hpp"

namespace moekit {
namespace {

using testing::TempDir;
using testing::write_file;

std::vector<std::uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(in),
                                   std::istreambuf_iterator<char>());
}

// The exact bytes numpy's format.write_array writes for a version 1.0 file: magic, version,
// u16 header length, the dict repr, spaces and a '\n' so that the data starts at a multiple of 64.
std::vector<std::uint8_t> numpy_bytes(const std::string& dict,
                                      const std::vector<std::uint8_t>& data) {
  const std::size_t hlen = dict.size() + 1;
  const std::size_t pad = 64 - (10 + hlen) % 64;
  std::string header = dict + std::string(pad, ' ') + "\n";
  std::vector<std::uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.push_back(static_cast<std::uint8_t>(header.size() & 0xff));
  out.push_back(static_cast<std::uint8_t>(header.size() >> 8));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// A tensor of `dtype` whose bytes are a recognisable pattern.
Tensor patterned(const Shape& shape, DType dtype) {
  Tensor t(shape, dtype);
  auto* p = static_cast<std::uint8_t*>(t.data());
  for (std::size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<std::uint8_t>(i * 37 + 11);
  return t;
}

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  ASSERT_EQ(a.nbytes(), b.nbytes());
  if (a.nbytes() != 0) {
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0);
  }
}

// Asserts `fn` throws runtime_error whose message starts with `prefix` and contains every `parts`.
template <typename Fn>
void expect_runtime_error(Fn fn, const std::string& prefix, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

TEST(NpyTest, RoundTripEveryDtypeAndRank) {
  TempDir dir("npy_roundtrip");
  const std::vector<Shape> shapes = {{}, {5}, {2, 3}, {2, 3, 4}, {0}, {3, 0, 2}, {1, 1, 1}, {64}};
  for (DType dtype : {DType::f32, DType::f16, DType::i32, DType::u8}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + shape_str(shape));
      const std::string path = dir.file(std::string("t_") + dtype_name(dtype) + ".npy");
      const Tensor t = patterned(shape, dtype);
      write_npy(path, t);
      const std::vector<std::uint8_t> bytes = file_bytes(path);
      // numpy's layout: data 64-byte aligned, header ending in '\n'.
      ASSERT_EQ((bytes.size() - t.nbytes()) % 64, 0u);
      EXPECT_EQ(bytes[bytes.size() - t.nbytes() - 1], '\n');
      expect_same(read_npy(path), t);
      expect_same(parse_npy(bytes.data(), bytes.size(), "mem"), t);
    }
  }
}

TEST(NpyTest, WritesExactlyWhatNumpyWrites) {
  TempDir dir("npy_numpy_layout");
  std::vector<float> values = {0, 1, 2, 3, 4, 5};
  const auto expected = numpy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                                    testing::to_bytes(values));
  ASSERT_EQ(expected.size(), 128u + 24u);
  const std::string path = dir.file("arange.npy");
  write_npy(path, Tensor::from_f32({2, 3}, values));
  EXPECT_EQ(file_bytes(path), expected);
  // Rank 1 and rank 0 reprs: (6,) and ().
  write_npy(path, Tensor::from_f32({6}, values));
  EXPECT_EQ(file_bytes(path),
            numpy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }",
                        testing::to_bytes(values)));
  write_npy(path, Tensor::from_f32({}, {7.f}));
  EXPECT_EQ(file_bytes(path), numpy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
                                          testing::to_bytes(std::vector<float>{7.f})));
}

TEST(NpyTest, ReadsNumpyFile) {
  TempDir dir("npy_numpy_read");
  std::vector<float> values = {0, 1, 2, 3, 4, 5};
  const std::string path = dir.file("arange.npy");
  write_file(path, numpy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                               testing::to_bytes(values)));
  const Tensor t = read_npy(path);
  ASSERT_EQ(t.dtype(), DType::f32);
  ASSERT_EQ(t.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data_as<float>()[i], static_cast<float>(i));
}

TEST(NpyTest, AcceptsHeaderVariations) {
  std::vector<std::int32_t> values = {1, 2, 3};
  const auto data = testing::to_bytes(values);
  // Key order, quotes, trailing commas and spacing that Python's literal syntax allows.
  for (const std::string dict :
       {"{'shape': (3,), 'fortran_order': False, 'descr': '<i4'}",
        "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (3, ), }",
        "{ 'descr':'<i4','fortran_order':False,'shape':(3,)\t}"}) {
    SCOPED_TRACE(dict);
    const auto bytes = numpy_bytes(dict, data);
    const Tensor t = parse_npy(bytes.data(), bytes.size(), "mem");
    ASSERT_EQ(t.shape(), (Shape{3}));
    EXPECT_EQ(t.data_as<std::int32_t>()[2], 3);
  }
  // '<u1' is accepted as u8 (byte order is meaningless for one byte).
  const auto u1 = numpy_bytes("{'descr': '<u1', 'fortran_order': False, 'shape': (2,), }", {7, 9});
  EXPECT_EQ(parse_npy(u1.data(), u1.size(), "mem").dtype(), DType::u8);
  // Trailing bytes after the array are ignored, as numpy.load does.
  auto extra = numpy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", data);
  extra.push_back(0xff);
  EXPECT_EQ(parse_npy(extra.data(), extra.size(), "mem").numel(), 3);
}

TEST(NpyTest, ReadsVersion2And3) {
  std::vector<float> values = {1.5f, -2.f};
  for (std::uint8_t major : {2, 3}) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
    header += std::string(64 - (12 + header.size() + 1) % 64, ' ') + "\n";
    std::vector<std::uint8_t> bytes = {0x93, 'N', 'U', 'M', 'P', 'Y', major, 0};
    for (int i = 0; i < 4; ++i)
      bytes.push_back(static_cast<std::uint8_t>(header.size() >> (8 * i)));
    bytes.insert(bytes.end(), header.begin(), header.end());
    const auto data = testing::to_bytes(values);
    bytes.insert(bytes.end(), data.begin(), data.end());
    const Tensor t = parse_npy(bytes.data(), bytes.size(), "v" + std::to_string(major));
    EXPECT_EQ(t.data_as<float>()[1], -2.f);
  }
}

TEST(NpyTest, ErrorsNameFileAndProblem) {
  TempDir dir("npy_errors");
  const std::vector<std::uint8_t> f4x2 = testing::to_bytes(std::vector<float>{1, 2});
  const auto dict = [](const std::string& descr, const std::string& fortran,
                       const std::string& shape) {
    return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  };
  struct Case {
    const char* what;
    std::vector<std::uint8_t> bytes;
    std::vector<std::string> parts;
  };
  auto truncated = numpy_bytes(dict("<f4", "False", "(2,)"), f4x2);
  truncated.pop_back();
  auto past_end = numpy_bytes(dict("<f4", "False", "(2,)"), {});
  past_end[8] = 0xff;
  past_end[9] = 0xff;
  auto bad_version = numpy_bytes(dict("<f4", "False", "(2,)"), f4x2);
  bad_version[6] = 4;
  const std::vector<Case> cases = {
      {"bad magic", {'N', 'O', 'T', 'N', 'P', 'Y', 1, 0, 0, 0}, {"bad magic"}},
      {"empty file", {}, {"bad magic"}},
      {"bad version", bad_version, {"version 4.0"}},
      {"version only", {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0}, {"too short"}},
      {"f8",
       numpy_bytes(dict("<f8", "False", "(1,)"), f4x2),
       {"unsupported dtype '<f8' (supported: <f4, <f2, <i4, |u1)"}},
      {"big endian", numpy_bytes(dict(">f4", "False", "(2,)"), f4x2), {"big-endian dtype '>f4'"}},
      {"fortran", numpy_bytes(dict("<f4", "True", "(2,)"), f4x2), {"fortran_order True"}},
      {"truncated", truncated, {"truncated data", "needs 8 bytes, file has 7"}},
      {"header past end", past_end, {"header length 65535 runs past the end"}},
      {"negative dim", numpy_bytes(dict("<f4", "False", "(-2,)"), f4x2), {"negative dimension"}},
      {"overflowing dim",
       numpy_bytes(dict("<f4", "False", "(99999999999999999999,)"), f4x2),
       {"overflows"}},
      {"overflowing numel",
       numpy_bytes(dict("<f4", "False", "(4294967296, 4294967296)"), f4x2),
       {"overflows"}},
      {"huge shape",
       numpy_bytes(dict("<f4", "False", "(1000000000000,)"), f4x2),
       {"truncated data"}},
      {"not a tuple",
       numpy_bytes(dict("<f4", "False", "(2)"), f4x2),
       {"malformed header dict", "(n,)"}},
      {"list shape",
       numpy_bytes(dict("<f4", "False", "[2]"), f4x2),
       {"malformed header dict", "expected '('"}},
      {"float dim", numpy_bytes(dict("<f4", "False", "(2.0,)"), f4x2), {"malformed header dict"}},
      {"missing key",
       numpy_bytes("{'descr': '<f4', 'shape': (2,), }", f4x2),
       {"missing key 'fortran_order'"}},
      {"extra key",
       numpy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4x2),
       {"unexpected key 'x'"}},
      {"duplicate key",
       numpy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", f4x2),
       {"duplicate key 'descr'"}},
      {"not a dict",
       numpy_bytes("('<f4', False, (2,))", f4x2),
       {"malformed header dict", "expected '{'"}},
      {"unterminated", numpy_bytes("{'descr': '<f4", f4x2), {"malformed header dict"}},
      {"no closing brace",
       numpy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", f4x2),
       {"malformed header dict"}},
      {"junk after dict",
       numpy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", f4x2),
       {"after the closing"}},
      {"bool spelled lower", numpy_bytes(dict("<f4", "false", "(2,)"), f4x2), {"True or False"}},
      {"structured dtype",
       numpy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", f4x2),
       {"structured dtypes"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("bad.npy");
    write_file(path, c.bytes);
    expect_runtime_error([&] { read_npy(path); }, "[moekit::read_npy] " + path + ": ", c.parts);
    expect_runtime_error([&] { parse_npy(c.bytes.data(), c.bytes.size(), "mem.npy"); },
                         "[moekit::parse_npy] mem.npy: ", c.parts);
  }
  expect_runtime_error([&] { read_npy(dir.file("missing.npy")); },
                       "[moekit::read_npy] " + dir.file("missing.npy"), {"cannot open"});
}

// Every prefix of a valid file, and every single-byte corruption of its header, either parses
// or throws runtime_error; nothing else (under ASan this also proves no out-of-bounds reads).
TEST(NpyTest, NoCrashOnCorruptBytes) {
  const auto good = numpy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1), }",
                                testing::to_bytes(std::vector<std::int32_t>{1, 2}));
  for (std::size_t n = 0; n < good.size(); ++n) {
    const std::vector<std::uint8_t> prefix(good.begin(),
                                           good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse_npy(prefix.data(), prefix.size(), "prefix"), std::runtime_error) << n;
  }
  for (std::size_t i = 0; i < 128; ++i) {
    for (std::uint8_t v : {0x00, 0x20, 0x27, 0x28, 0x29, 0x2c, 0x2d, 0x39, 0x7b, 0x7d, 0xff}) {
      std::vector<std::uint8_t> b = good;
      b[i] = v;
      try {
        parse_npy(b.data(), b.size(), "corrupt");
      } catch (const std::runtime_error&) {
      }
    }
  }
}

TEST(NpyTest, WriteErrors) {
  TempDir dir("npy_write_errors");
  const Tensor bf = Tensor(Shape{2}, DType::bf16);
  EXPECT_THROW(write_npy(dir.file("bf.npy"), bf), std::invalid_argument);
  EXPECT_FALSE(std::filesystem::exists(dir.file("bf.npy")));
  EXPECT_THROW(write_npy(dir.file("undef.npy"), TensorView()), std::invalid_argument);

  const std::string missing_dir = dir.file("no/such/dir");
  expect_runtime_error([&] { write_npy(missing_dir + "/x.npy", Tensor::from_f32({1}, {1.f})); },
                       "[moekit::write_npy] " + missing_dir + "/x.npy: ", {"cannot create"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("no")));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  // Overwriting replaces the old file atomically and leaves no temporary behind.
  const std::string path = dir.file("a.npy");
  write_npy(path, Tensor::from_f32({1}, {1.f}));
  write_npy(path, Tensor::from_f32({2}, {2.f, 3.f}));
  EXPECT_EQ(read_npy(path).numel(), 2);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1u);
  // A target that is a folder: the rename fails, the folder and the temp file do not survive.
  const std::string folder = dir.file("folder.npy");
  std::filesystem::create_directory(folder);
  write_file(dir.file("folder.npy/keep"), {1});
  expect_runtime_error([&] { write_npy(folder, Tensor::from_f32({1}, {1.f})); },
                       "[moekit::write_npy] " + folder, {"rename"});
  files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 2u);
}

}  // namespace
}  // namespace moekit
