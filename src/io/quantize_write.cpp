// The write phase of moekit quantize (quantize_plan.hpp): every planned tensor produced from
// slabs of the source and streamed into its shard, then the index, config.json and the side
// files mlx_lm.convert carries over.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "io/quantize_plan.hpp"
#include "kernels/formats/table.hpp"
#include "kernels/quantize.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit::detail {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

float round_to(float v, DType d) {
  if (d == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (d == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// Elements [offset, offset + count) of source tensor `name` as f32, rounded to `cast` first (as
// mlx-lm casts before it quantizes).
void read_source(const Checkpoint& ck, const std::string& name, std::int64_t offset,
                 std::int64_t count, DType cast, float* out) {
  const TensorView all = ck.view(name);
  convert(all.reshaped({all.numel()}).slice_rows(offset, offset + count),
          TensorView(out, {count}, DType::f32));
  if (cast != DType::f32)
    for (std::int64_t i = 0; i < count; ++i) out[i] = round_to(out[i], cast);
}

// Slabs of a shape: its leading dimension (1 for a scalar) and the elements of each.
std::int64_t lead_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
std::int64_t inner_of(const Shape& s) { return lead_of(s) > 0 ? shape_numel(s) / lead_of(s) : 0; }

// The f32 values of output slabs [l0, l1) of a job (slab = one index of the output's leading
// dimension: an expert of a stacked projection, a head of an MLA split, a row of a matrix). Each
// slab comes from one slab of the source: a whole per-expert tensor, or the same share of the
// single source tensor, re-laid out for a split. Memory: the slabs asked for, never the model.
std::vector<float> read_values(const Checkpoint& ck, const Job& j, std::int64_t l0,
                               std::int64_t l1) {
  const std::int64_t lead = lead_of(j.shape), inner = inner_of(j.shape);
  if (lead <= 0 || l1 <= l0) return {};
  const bool multi = j.sources.size() > 1;
  const std::int64_t src_inner = multi ? shape_numel(ck.info(j.sources[0]).shape)
                                       : shape_numel(ck.info(j.sources[0]).shape) / lead;
  std::vector<float> out(static_cast<std::size_t>((l1 - l0) * inner));
  std::vector<float> slab(static_cast<std::size_t>(src_inner));
  for (std::int64_t l = l0; l < l1; ++l) {
    float* dst = out.data() + (l - l0) * inner;
    float* src = (j.mla || j.fused) ? slab.data() : dst;
    read_source(ck, multi ? j.sources[static_cast<std::size_t>(l)] : j.sources[0],
                multi ? 0 : l * src_inner, src_inner, *j.cast, src);
    if (j.mla) {  // this head's rows v[d, r] = src[d·R + r], d < nope + vdim
      const std::int64_t R = j.rank;
      for (std::int64_t r = 0; r < R; ++r) {
        if (j.mla == 1)
          for (std::int64_t n = 0; n < j.nope; ++n) dst[r * j.nope + n] = src[n * R + r];
        else
          for (std::int64_t d = 0; d < j.vdim; ++d) dst[d * R + r] = src[(j.nope + d) * R + r];
      }
    } else if (j.fused) {  // this expert's [P, Q] source -> [Q / step, P]
      const std::int64_t step = j.pick ? 2 : 1, off = j.pick == 2 ? 1 : 0, Q = j.fq / step;
      for (std::int64_t q = 0; q < Q; ++q)
        for (std::int64_t p = 0; p < j.fp; ++p) dst[q * j.fp + p] = src[p * j.fq + q * step + off];
    }
  }
  return out;
}

std::vector<std::uint8_t> encode(std::vector<float> v, DType d) {
  std::vector<std::uint8_t> out(v.size() * dtype_size(d));
  const Shape n{static_cast<std::int64_t>(v.size())};
  convert(TensorView(v.data(), n, DType::f32), TensorView(out.data(), n, d));
  return out;
}

// Rows to quantize run as this many tasks, each with its own error sums, so the sums (and so
// the report) do not depend on the thread count.
constexpr std::int64_t kTasks = 64;

struct ErrorSums {
  double max_abs = 0, sq = 0, wsq = 0;
};

// A quantized job's output being built: codes [rows, words], scales and biases [rows, groups].
struct Packed {
  std::int64_t in = 0, words = 0, groups = 0;
  std::vector<std::uint32_t> codes;
  std::vector<float> scales, biases;
  std::vector<std::uint8_t> scale_bytes;  // an fp mode's
  std::vector<ErrorSums> errs = std::vector<ErrorSums>(kTasks);
};

// One weight's dequantization error into `er`.
void add_error(float deq, float w, ErrorSums& er) {
  const double d = std::abs(static_cast<double>(deq) - w);
  er.max_abs = std::max(er.max_abs, d);
  er.sq += d * d;
  er.wsq += static_cast<double>(w) * w;
}

// Quantizes row `w` (in values) into row r of `pk` — affine: scales and biases rounded to the
// job's dtype; an fp mode: scale bytes — and adds its dequantization error to `er`.
void quantize_row(const Job& j, const float* w, std::int64_t r, Packed& pk, ErrorSums& er) {
  std::uint32_t* q = pk.codes.data() + r * pk.words;
  if (j.fp_mode) {  // an fp mode: codes and scale bytes, decoded back by the format's rule
    std::uint8_t* sb = pk.scale_bytes.data() + r * pk.groups;
    kernels::quantize_fp_row(w, pk.in, *j.fp_mode, *j.cast, q, sb);
    const WeightFormat f = *j.fp_mode == kernels::FpMode::mxfp4   ? WeightFormat::mxfp4()
                           : *j.fp_mode == kernels::FpMode::nvfp4 ? WeightFormat::nvfp4()
                                                                  : WeightFormat::mxfp8();
    const kernels::WeightMatrix m{q, DType::u8, pk.words * 4, kernels::WeightLayout::rows, f, sb, nullptr, pk.groups};
    for (std::int64_t k = 0; k < pk.in; ++k) add_error(kernels::formats::decode(m, 0, k), w[k], er);
    return;
  }
  float* sc = pk.scales.data() + r * pk.groups;
  float* bi = pk.biases.data() + r * pk.groups;
  kernels::quantize_affine_row(w, pk.in, j.bits, j.group, q, sc, bi);
  for (std::int64_t g = 0; g < pk.groups; ++g) {
    sc[g] = round_to(sc[g], *j.cast);
    bi[g] = round_to(bi[g], *j.cast);
  }
  for (std::int64_t k = 0; k < pk.in; ++k) {
    const std::int64_t bit = k * j.bits;
    std::uint64_t pair = q[bit / 32];
    if (bit % 32 + j.bits > 32) pair |= static_cast<std::uint64_t>(q[bit / 32 + 1]) << 32;
    const float code = static_cast<float>((pair >> (bit % 32)) & ((1u << j.bits) - 1u));
    add_error(std::fma(sc[k / j.group], code, bi[k / j.group]), w[k], er);
  }
}

// Quantizes rows [base, base + n_rows) of `pk` from `w` in parallel; refuses the first row (in
// row order) that holds a NaN or Inf, naming its source tensor and row.
void quantize_rows(const Checkpoint& ck, const Job& j, const std::vector<float>& w,
                   std::int64_t base, std::int64_t n_rows, std::int64_t rows_per_lead, Packed& pk) {
  const std::int64_t chunks = std::min<std::int64_t>(n_rows, kTasks);
  std::vector<std::int64_t> first_bad(static_cast<std::size_t>(chunks), -1);
  parallel_tasks(chunks, [&](std::int64_t c) {
    const std::int64_t r0 = n_rows * c / chunks, r1 = n_rows * (c + 1) / chunks;
    for (std::int64_t rr = r0; rr < r1; ++rr) {
      const float* row = w.data() + rr * pk.in;
      bool finite = true;
      for (std::int64_t k = 0; k < pk.in; ++k) finite = finite && std::isfinite(row[k]);
      if (!finite) {
        if (first_bad[static_cast<std::size_t>(c)] < 0)
          first_bad[static_cast<std::size_t>(c)] = base + rr;
        continue;
      }
      quantize_row(j, row, base + rr, pk, pk.errs[static_cast<std::size_t>(c)]);
    }
  });
  for (const std::int64_t r : first_bad) {
    if (r < 0) continue;
    const bool multi = j.sources.size() > 1;
    const std::int64_t per =
        multi ? rows_per_lead : shape_numel(j.shape) / pk.in;  // rows per source tensor
    const std::string& where = multi ? j.sources[static_cast<std::size_t>(r / per)] : j.sources[0];
    quantize_bad(MOEKIT_MSG(ck.info(where).file
                            << ": tensor '" << where << "' row " << (r % per)
                            << " holds a NaN or Inf; moekit quantize refuses to encode it"));
  }
}

// The bytes of one job's output tensors, in the plan's order, and its share of the report.
struct Produced {
  std::vector<std::vector<std::uint8_t>> tensors;
  std::int64_t params = 0;  // for the index's total_parameters
};

// A quantized job: codes, scales, biases, read `step` slabs at a time.
Produced produce_quantized(const Checkpoint& ck, const Job& j, std::int64_t step,
                           QuantizeReport& report) {
  const std::int64_t lead = lead_of(j.shape), inner = inner_of(j.shape);
  Packed pk;
  pk.in = j.shape.back();
  pk.words = pk.in * j.bits / 32;
  pk.groups = pk.in / j.group;
  const std::int64_t rows = shape_numel(j.shape) / pk.in, rows_per_lead = inner / pk.in;
  pk.codes.resize(static_cast<std::size_t>(rows * pk.words));
  if (j.fp_mode) {
    pk.scale_bytes.resize(static_cast<std::size_t>(rows * pk.groups));
  } else {
    pk.scales.resize(static_cast<std::size_t>(rows * pk.groups));
    pk.biases.resize(pk.scales.size());
  }
  for (std::int64_t l0 = 0; l0 < lead; l0 += step) {
    const std::int64_t l1 = std::min(lead, l0 + step);
    quantize_rows(ck, j, read_values(ck, j, l0, l1), l0 * rows_per_lead, (l1 - l0) * rows_per_lead,
                  rows_per_lead, pk);
  }
  QuantizedTensorReport qr{j.out, j.shape, j.bits, j.group, 0, 0, 0};
  double sq = 0, wsq = 0;
  for (const ErrorSums& er : pk.errs) {
    qr.max_abs_error = std::max(qr.max_abs_error, er.max_abs);
    sq += er.sq;
    wsq += er.wsq;
  }
  const double n = static_cast<double>(shape_numel(j.shape));
  qr.rms_error = std::sqrt(sq / n);
  qr.rms_weight = std::sqrt(wsq / n);
  report.quantized.push_back(qr);
  Produced p;
  const auto* cb = reinterpret_cast<const std::uint8_t*>(pk.codes.data());
  p.tensors.emplace_back(cb, cb + pk.codes.size() * 4);
  if (j.fp_mode) {
    p.tensors.push_back(std::move(pk.scale_bytes));
  } else {
    p.tensors.push_back(encode(pk.scales, *j.cast));
    p.tensors.push_back(encode(pk.biases, *j.cast));
  }
  p.params = shape_numel(j.shape);
  return p;
}

// The output tensors of job `j`: a raw copy, a cast float tensor, or a quantized module.
Produced produce(const Checkpoint& ck, const Job& j, std::int64_t slab_values,
                 QuantizeReport& report) {
  Produced p;
  if (!j.cast) {  // raw copy
    const TensorInfo& info = ck.info(j.sources[0]);
    const std::uint8_t* raw = ck.bytes(j.sources[0]);
    p.tensors.emplace_back(raw, raw + (info.end - info.begin));
    report.bytes_in += static_cast<std::int64_t>(info.end - info.begin);
    p.params = shape_numel(j.shape);
    ++report.tensors_kept_float;
    return p;
  }
  if (j.mla != 2 && !(j.fused && j.pick == 2))  // the two halves of a split read one tensor
    for (const std::string& s : j.sources)
      report.bytes_in += static_cast<std::int64_t>(ck.info(s).end - ck.info(s).begin);
  // Whole slabs of about slab_values values at a time (at least one), whatever the tensor.
  const std::int64_t lead = lead_of(j.shape), inner = inner_of(j.shape);
  const std::int64_t step =
      std::max<std::int64_t>(1, slab_values / std::max<std::int64_t>(1, inner));
  if (j.bits) return produce_quantized(ck, j, step, report);
  std::vector<std::uint8_t> bytes;
  bytes.reserve(static_cast<std::size_t>(shape_numel(j.shape)) * dtype_size(*j.cast));
  for (std::int64_t l0 = 0; l0 < lead; l0 += step) {
    const std::vector<std::uint8_t> part =
        encode(read_values(ck, j, l0, std::min(lead, l0 + step)), *j.cast);
    bytes.insert(bytes.end(), part.begin(), part.end());
  }
  p.tensors.push_back(std::move(bytes));
  if (j.counted) p.params = shape_numel(j.shape);
  ++report.tensors_kept_float;
  return p;
}

// mlx_lm.utils.save_model's file names: one "model.safetensors", or numbered shards.
std::string shard_file(std::size_t s, std::size_t count) {
  if (count == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", static_cast<int>(s + 1),
                static_cast<int>(count));
  return buf;
}

// The index's metadata and weight map, filled while the shards are written.
struct Index {
  json weight_map = json::object();
  std::int64_t total_size = 0, total_params = 0;
};

// Streams every planned tensor into its shard, producing each job once, when its first output
// tensor is due (a job's tensors are consecutive in the plan).
void write_shards(const QuantizePlan& plan, const QuantizeOptions& opt, const fs::path& tmp,
                  Index& index, QuantizeReport& report) {
  std::size_t job_done = static_cast<std::size_t>(-1);
  Produced pending;  // the current job's output tensors, in order
  std::size_t pending_at = 0;
  for (std::size_t s = 0; s < plan.shards.size(); ++s) {
    const std::string file = shard_file(s, plan.shards.size());
    std::vector<SafetensorsWriter::Entry> entries;
    for (const std::size_t k : plan.shards[s]) entries.push_back(plan.outs[k].entry);
    SafetensorsWriter writer((tmp / file).string(), entries, {{"format", "mlx"}});
    for (const std::size_t k : plan.shards[s]) {
      const OutTensor& o = plan.outs[k];
      if (o.job != job_done) {
        pending = {};  // freed first: memory holds one job's output at a time
        pending = produce(*plan.ck, plan.jobs[o.job], opt.slab_values, report);
        pending_at = 0;
        index.total_params += pending.params;
        job_done = o.job;
      }
      const std::vector<std::uint8_t>& bytes = pending.tensors.at(pending_at++);
      writer.write(bytes.data(), bytes.size());
      index.weight_map[o.entry.name] = file;
      index.total_size += static_cast<std::int64_t>(bytes.size());
      ++report.tensors_written;
    }
    writer.commit();
  }
}

// The index and config.json, the latter with mlx-lm's `quantization` and its mirror.
void write_index_and_config(const QuantizePlan& plan, const Index& index, const fs::path& tmp) {
  const json index_json = {
      {"metadata", {{"total_size", index.total_size}, {"total_parameters", index.total_params}}},
      {"weight_map", index.weight_map}};
  std::ofstream(tmp / "model.safetensors.index.json") << index_json.dump(4);
  json out_config = plan.config;
  out_config.erase("_name_or_path");
  out_config.erase("vision_config");
  out_config["quantization"] = plan.qconfig;
  out_config["quantization_config"] = plan.qconfig;
  std::ofstream cf(tmp / "config.json");
  cf << out_config.dump(4);
  if (!cf)
    throw std::runtime_error("[moekit::quantize_checkpoint] cannot write " +
                             (tmp / "config.json").string());
}

// Copies the tokenizer, generation and code files mlx_lm.convert carries over.
void copy_side_files(const fs::path& from, const fs::path& to) {
  for (const auto& e : fs::directory_iterator(from)) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    const std::string ext = e.path().extension().string();
    const bool keep = n.rfind("tokenizer", 0) == 0 || n == "special_tokens_map.json" ||
                      n == "added_tokens.json" || n == "generation_config.json" ||
                      n == "chat_template.json" || n == "chat_template.jinja" ||
                      n.rfind("vocab", 0) == 0 || n == "merges.txt" || ext == ".tiktoken" ||
                      ext == ".py";
    if (keep) fs::copy_file(e.path(), to / n, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

void write_quantized(const QuantizePlan& plan, const QuantizeOptions& opt, const fs::path& src,
                     const fs::path& tmp, QuantizeReport& report) {
  Index index;
  write_shards(plan, opt, tmp, index, report);
  report.shards = static_cast<std::int64_t>(plan.shards.size());
  report.bytes_out = index.total_size;
  write_index_and_config(plan, index, tmp);
  copy_side_files(src, tmp);
}

}  // namespace moekit::detail
