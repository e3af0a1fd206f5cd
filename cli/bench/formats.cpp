// `moekit bench`'s options: the shapes, weight formats and layouts they name, and what a layer
// of each weighs.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "bench/bench.hpp"
#include "format.hpp"

namespace moekit::cli::bench {

const char* const kDtypeList =
    "f32, bf16, f16; q2, q3, q4, q5, q6, q8 (MLX affine, group 64, bf16 scales); mxfp4 (e2m1, group 32, "
    "e8m0 scales); nvfp4 (e2m1, group 16, e4m3 scales); int4 (compressed-tensors, group 32, bf16 scales); "
    "q4-int8, q8-int8, mxfp4-int8, nvfp4-int8, int4-int8 (the int8 fast mode); fp8 (e4m3, 128 x 128 "
    "blocks, f32 scales); bf16-act (bf16 weights, bf16 compute mode); fp8-bf16-act (the fp8 weights, bf16 "
    "compute mode)";

std::string WeightFormat::name() const {
  if (bf16_act) return quantized() ? "fp8-bf16-act" : "bf16-act";
  if (!quantized()) return dtype_name(dtype);
  std::string n = element == Element::e2m1   ? (nv ? "nvfp4" : "mxfp4")
                  : element == Element::int4 ? "int4"
                  : element == Element::e4m3 ? "fp8"
                                             : std::string{'q', static_cast<char>('0' + bits)};
  if (int8) n += "-int8";
  return n;
}

synth::WeightSpec WeightFormat::spec() const {
  synth::WeightSpec s;
  s.dtype = dtype;
  s.bits = bits;
  s.group = element == Element::e2m1   ? (nv ? 16 : 32)
            : element == Element::e4m3 ? 128
            : element == Element::int4 ? 32
                                       : kGroup;
  s.element = element;
  return s;
}

// The reference shapes by name; `all` means qwen3 + deepseek (Mixtral's f32 weights are 5.6 GB);
// `tiny` is for smoke tests.
std::vector<const BenchShape*> parse_shapes(const std::string& text) {
  std::vector<const BenchShape*> out;
  const auto add = [&](const BenchShape* s) {
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  };
  for (const std::string& item : split_list(text, "--shape")) {
    if (item == "all") {
      add(synth::find_reference_shape("qwen3"));
      add(synth::find_reference_shape("deepseek"));
      continue;
    }
    const BenchShape* found = synth::find_reference_shape(item);
    if (found == nullptr)
      throw std::invalid_argument("--shape '" + item +
                                  "' is not a bench shape (expected qwen3, deepseek, mixtral, all, "
                                  "or tiny for smoke tests)");
    add(found);
  }
  return out;
}

std::vector<WeightFormat> parse_dtypes(const std::string& text) {
  std::vector<WeightFormat> out;
  for (const std::string& listed : split_list(text, "--dtype")) {
    // "-int8": the fast mode, on the formats it takes.
    static const std::string kInt8 = "-int8";
    const bool int8 =
        listed.size() > kInt8.size() && listed.compare(listed.size() - kInt8.size(), kInt8.size(), kInt8) == 0;
    const std::string item = int8 ? listed.substr(0, listed.size() - kInt8.size()) : listed;
    if (int8 && item != "q4" && item != "q8" && item != "mxfp4" && item != "nvfp4" && item != "int4")
      throw std::invalid_argument("--dtype '" + listed + "' is not a weight format moekit runs (expected " +
                                  kDtypeList + ")");
    WeightFormat f;
    f.int8 = int8;
    if (item == "f32") {
      f.dtype = DType::f32;
    } else if (item == "bf16") {
      f.dtype = DType::bf16;
    } else if (item == "bf16-act") {
      f.dtype = DType::bf16;
      f.bf16_act = true;
    } else if (item == "f16") {
      f.dtype = DType::f16;
    } else if (item.size() == 2 && item[0] == 'q' && std::string("234568").find(item[1]) != std::string::npos) {
      f.dtype = DType::u32;
      f.bits = item[1] - '0';
    } else if (item == "mxfp4") {
      f.dtype = DType::u8;
      f.bits = 4;
      f.element = Element::e2m1;
    } else if (item == "nvfp4" || item == "int4") {
      f.dtype = DType::u8;
      f.bits = 4;
      f.element = item == "int4" ? Element::int4 : Element::e2m1;
      f.nv = item == "nvfp4";
    } else if (item == "fp8" || item == "fp8-bf16-act") {
      f.dtype = DType::u8;
      f.bits = 8;
      f.element = Element::e4m3;
      f.bf16_act = item == "fp8-bf16-act";
    } else {
      throw std::invalid_argument("--dtype '" + listed + "' is not a weight format moekit runs (expected " +
                                  kDtypeList + ")");
    }
    for (const WeightFormat& g : out)
      if (g.name() == f.name()) throw std::invalid_argument("--dtype '" + text + "' lists " + listed + " twice");
    out.push_back(f);
  }
  return out;
}

std::vector<std::string> parse_layouts(const std::string& text) {
  std::vector<std::string> out;
  for (const std::string& item : split_list(text, "--layout")) {
    if (item != "rows" && item != "panels")
      throw std::invalid_argument("--layout '" + item + "' is not a weight layout (expected panels or rows)");
    if (std::find(out.begin(), out.end(), item) != out.end())
      throw std::invalid_argument("--layout '" + text + "' lists " + item + " twice");
    out.push_back(item);
  }
  return out;
}

// Bytes of one expert's three matrices (quantized: codes + bf16 scales and biases; MXFP4: nibbles
// + one e8m0 byte per 32; FP8: bytes + one f32 per 128 × 128 block).
double expert_bytes(const BenchShape& s, const WeightFormat& f) {
  const double n = 3.0 * static_cast<double>(s.D) * static_cast<double>(s.F);
  if (f.element == Element::e2m1) return n * 4 / 8.0 + n / (f.nv ? 16.0 : 32.0);
  if (f.element == Element::int4) return n * 4 / 8.0 + n / 32.0 * 2.0;
  if (f.element == Element::e4m3) {
    const double blocks = 3.0 * std::ceil(static_cast<double>(s.D) / 128) * std::ceil(static_cast<double>(s.F) / 128);
    return n + 4.0 * blocks;
  }
  if (f.quantized()) return n * f.bits / 8.0 + n / WeightFormat::kGroup * 2.0 * 2.0;
  return n * static_cast<double>(dtype_size(f.dtype));
}

double layer_weight_bytes(const BenchShape& s, const WeightFormat& f) {
  return static_cast<double>(s.E + s.shared) * expert_bytes(s, f);
}

std::string gb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GB", bytes * 1e-9);
  return buf;
}

// MemAvailable from /proc/meminfo in bytes, or -1 where it cannot be read.
double available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return kb * 1024.0;
  }
  return -1.0;
}


std::unique_ptr<MoeLayer> build_layer(const BenchShape& s, const WeightFormat& format, bool panels,
                                      std::uint64_t seed) {
  MoeConfig cfg = synth::config_of(s);
  MoeWeights w = synth::random_weights(cfg, format.spec(), seed);
  auto layer = std::make_unique<MoeLayer>(std::move(cfg), std::move(w));
  if (format.bf16_act) layer->set_bf16_activations(true);  // first: packing then takes its layout
  if (panels && !format.quantized()) layer->pack_weights();  // quantized experts are read in place
  if (format.int8) layer->set_int8_activations(true);
  return layer;
}

}  // namespace moekit::cli::bench
