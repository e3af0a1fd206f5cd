// `moekit bench --decode`: decode at the memory limit. A real model's MoE layers hold far more
// expert bytes than any cache, and each token draws a fresh routing in every layer, so every byte
// of the experts a token selects streams in from DRAM. Timing one layer over and over leaves the
// experts of recent calls in the cache and overstates the speed; here L distinct layers (their
// experts together at least 8x the last-level cache, unless --layers says otherwise) are called
// in turn, each call on fresh random tokens, so each sees a routing and weights no recent call
// left behind.
//
// Per row (shape, dtype, layout, T, threads): the median ms of a layer call, the bytes it touched
// (the distinct routed experts of its routing, the shared experts and the router, each counted
// once), those bytes over the median time in GB/s, their fraction of the DRAM read bandwidth
// measured in the same run, and the tokens/s of a model of L such layers (T / (L x median)).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench.hpp"
#include "experts/expert_rows.hpp"
#include "format.hpp"
#include "util/error.hpp"

namespace moekit::cli::bench {

namespace {

// Layers at most (a tiny shape would otherwise ask for thousands).
constexpr std::int64_t kMaxLayers = 64;
// The last-level cache assumed where sysfs does not say.
constexpr std::size_t kDefaultLlc = std::size_t{32} << 20;

struct Cache {
  std::size_t bytes = kDefaultLlc;
  std::string source = "assumed (sysfs has no cache sizes)";
};

// The largest cache level of CPU 0 from sysfs ("32768K").
Cache last_level_cache() {
  Cache c;
  int best_level = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || size.empty()) continue;
    std::size_t mult = 1;
    if (size.back() == 'K') mult = std::size_t{1} << 10;
    if (size.back() == 'M') mult = std::size_t{1} << 20;
    if (mult != 1) size.pop_back();
    std::size_t value = 0;
    try {
      value = static_cast<std::size_t>(std::stoull(size)) * mult;
    } catch (const std::exception&) {
      continue;
    }
    if (level > best_level && value > 0) {
      best_level = level;
      c.bytes = value;
      c.source = "L" + std::to_string(level) + " of cpu0 (sysfs)";
    }
  }
  return c;
}

struct DecodeRow {
  std::string shape, dtype, layout;
  std::int64_t tokens = 0, layers = 0;
  int threads = 0;
  double ms_per_layer = 0, min_ms = 0, touched_bytes = 0, gbps = 0, dram_fraction = 0, tokens_per_s = 0;
  std::string kernels;  // the kernel plan the last timed call of the first layer ran (planned_kernels)
};

// The layers of one (shape, format, layout): --layers, or enough that their expert bytes reach
// 8x the cache, within kMaxLayers and what memory holds (at least one).
std::int64_t layers_for(const BenchShape& s, const WeightFormat& d, const Plan& p, std::size_t llc) {
  const double per_layer = layer_weight_bytes(s, d), avail = available_memory();
  const auto fits = [&](std::int64_t L) { return avail < 0 || per_layer * static_cast<double>(L) + 256e6 <= avail; };
  if (p.layers > 0) {
    if (!fits(p.layers))
      throw std::runtime_error(MOEKIT_MSG("out of memory: --layers "
                                          << p.layers << " of " << s.name << " " << d.name() << " need "
                                          << gb(per_layer * static_cast<double>(p.layers)) << " but only " << gb(avail)
                                          << " is available"));
    return p.layers;
  }
  auto L = static_cast<std::int64_t>(std::ceil(8.0 * static_cast<double>(llc) / per_layer));
  L = std::clamp<std::int64_t>(L, 1, kMaxLayers);
  while (L > 1 && !fits(L)) --L;
  return L;
}

// What a call on one layer touches: `per_expert` bytes per routed expert its routing selects, and
// `fixed` bytes every call reads (the shared experts and the router).
struct LayerBytes {
  double per_expert = 0, fixed = 0;
};

// The rows of one set of layers (every T and thread count): the layers called in turn, one warm-up
// pass and p.reps timed passes, every call on fresh tokens.
std::vector<DecodeRow> time_layers(const std::vector<std::unique_ptr<MoeLayer>>& layers,
                                   const std::vector<LayerBytes>& bytes, const DecodeRow& label, const Plan& p,
                                   const Limits& limits, bool progress) {
  const std::int64_t L = static_cast<std::int64_t>(layers.size());
  const std::int64_t D = layers.front()->config().hidden_size, E = layers.front()->weights().experts.num_experts();
  std::vector<DecodeRow> rows;
  std::uint64_t stream = p.seed * 1000003 + 17;  // every call's tokens drawn afresh
  for (const std::int64_t T : p.tokens) {
    Tensor x = Tensor::uninitialized({T, D}, DType::f32);
    for (const std::int64_t nt : p.threads) {
      if (progress)
        std::fprintf(stderr, "moekit bench --decode: %s %s T=%lld threads=%lld, %lld layers\n", label.shape.c_str(),
                     label.dtype.c_str(), static_cast<long long>(T), static_cast<long long>(nt),
                     static_cast<long long>(L));
      set_num_threads(static_cast<int>(nt));
      std::vector<double> secs;
      double touched = 0;
      std::string kernels;
      for (int r = -1; r < p.reps; ++r)  // one warm-up pass over the layers
        for (std::int64_t l = 0; l < L; ++l) {
          synth::fill_uniform(x, 1.0f, stream++);
          ForwardInfo info;
          const auto t0 = Clock::now();
          const Tensor y = layers[static_cast<std::size_t>(l)]->forward(x, &info);
          const double dt = seconds_since(t0);
          if (r < 0) continue;
          secs.push_back(dt);
          std::int64_t active = 0;
          const std::vector<std::int64_t> counts = expert_counts(info.routing.ids, E);
          for (const std::int64_t c : counts) active += c > 0;
          if (l == 0) kernels = planned_kernels(*layers.front(), counts, T);
          const LayerBytes& b = bytes[static_cast<std::size_t>(l)];
          touched += b.per_expert * static_cast<double>(active) + b.fixed;
        }
      DecodeRow row = label;
      row.tokens = T;
      row.layers = L;
      row.threads = static_cast<int>(nt);
      const double med = median_of(secs);
      row.ms_per_layer = med * 1e3;
      row.min_ms = *std::min_element(secs.begin(), secs.end()) * 1e3;
      row.touched_bytes = touched / static_cast<double>(secs.size());
      row.gbps = row.touched_bytes / med / 1e9;
      row.dram_fraction = limits.dram_gbs > 0 ? row.gbps / limits.dram_gbs : 0;
      row.tokens_per_s = static_cast<double>(T) / (static_cast<double>(L) * med);
      row.kernels = kernels;
      rows.push_back(row);
    }
  }
  return rows;
}

// Every row of one (shape, format, layout): its random layers built, then timed.
std::vector<DecodeRow> run_layers(const BenchShape& s, const WeightFormat& d, const std::string& layout, const Plan& p,
                                  const Limits& limits, std::size_t llc, bool progress) {
  const std::int64_t L = layers_for(s, d, p, llc);
  std::vector<std::unique_ptr<MoeLayer>> layers;
  std::vector<LayerBytes> bytes;
  for (std::int64_t l = 0; l < L; ++l) {
    layers.push_back(build_checked(s, d, layout == "panels", p.seed * 1000 + static_cast<std::uint64_t>(l), progress));
    bytes.push_back({expert_bytes(s, d), expert_bytes(s, d) * static_cast<double>(s.shared) +
                                             static_cast<double>(layers.back()->weights().router.nbytes())});
  }
  DecodeRow label;
  label.shape = s.name;
  label.dtype = d.name();
  label.layout = d.quantized() ? d.name() : layout;
  return time_layers(layers, bytes, label, p, limits, progress);
}

// Every page of a mapped layer's experts read once before timing, as a server's first passes
// would read them: otherwise the first rows pay the mapping's first-touch page faults (about 5k
// per T = 1 call on a Qwen3-30B-A3B layer in q4_K), which ggml's harness, computing on weights in
// its own memory, never pays. One byte per 4 KB page of each expert's matrices.
void fault_in(const MoeWeights& w) {
  unsigned char sum = 0;
  for (const ExpertMatrix* m : {&w.experts.gate, &w.experts.up, &w.experts.down}) {
    if (m->rows <= 0) continue;
    const std::size_t span = static_cast<std::size_t>((m->rows - 1) * m->row_stride) * dtype_size(m->dtype);
    for (const void* e : m->experts)
      for (std::size_t o = 0; o < span; o += 4096) sum ^= static_cast<const volatile unsigned char*>(e)[o];
  }
  asm volatile("" : : "r"(sum));  // the reads stay
}

// --model: the checkpoint's MoE layers (all, or the first --layers of them), loaded as `moekit
// forward` loads them (mapped, used in place).
std::vector<DecodeRow> run_model(const std::string& dir, bool int8, const Plan& p, const Limits& limits,
                                 bool progress) {
  const MoeConfig cfg = load_config(dir);
  std::vector<std::int64_t> which = cfg.moe_layer_indices();
  if (which.empty()) throw std::invalid_argument("--model " + dir + " has no MoE layers");
  if (p.layers > 0) {
    if (p.layers > static_cast<std::int64_t>(which.size()))
      throw std::invalid_argument(
          MOEKIT_MSG("--layers " << p.layers << ": " << dir << " has " << which.size() << " MoE layers"));
    which.resize(static_cast<std::size_t>(p.layers));
  }
  std::vector<std::unique_ptr<MoeLayer>> layers;
  std::vector<LayerBytes> bytes;
  for (const std::int64_t l : which) {
    if (progress)
      std::fprintf(stderr, "moekit bench --decode: loading layer %lld of %s\n", static_cast<long long>(l), dir.c_str());
    layers.push_back(std::make_unique<MoeLayer>(load_moe_layer(dir, cfg, l)));
    if (int8) layers.back()->set_int8_activations(true);
    fault_in(layers.back()->weights());
    const MoeWeights& w = layers.back()->weights();
    const double E = static_cast<double>(w.experts.num_experts());
    bytes.push_back(
        {static_cast<double>(w.experts.nbytes()) / E, static_cast<double>(w.shared.nbytes() + w.router.nbytes())});
  }
  DecodeRow label;
  label.shape = std::filesystem::path(dir).filename().string();
  if (label.shape.empty()) label.shape = std::filesystem::path(dir).parent_path().filename().string();
  label.dtype = layers.front()->weights().experts.down.describe() + (int8 ? ", int8" : "");
  label.layout = "checkpoint";
  return time_layers(layers, bytes, label, p, limits, progress);
}

void print_md(const Header& h, const Limits& l, const Cache& llc, const std::vector<const BenchShape*>& shapes,
              const std::string& model, const std::vector<DecodeRow>& rows) {
  print_md_header("moekit bench --decode", h);
  std::printf("- last-level cache: %s, %s; layers per row: their experts at least 8x it (or --layers)\n",
              format_bytes(llc.bytes).c_str(), llc.source.c_str());
  std::printf("- %d passes over the layers per row after one warm-up pass, fresh random tokens every call\n", h.reps);
  for (const BenchShape* s : (model.empty() ? shapes : std::vector<const BenchShape*>{}))
    std::printf("- %s: %s, D = %lld, F = %lld, E = %lld, K = %lld\n", s->name, s->description,
                static_cast<long long>(s->D), static_cast<long long>(s->F), static_cast<long long>(s->E),
                static_cast<long long>(s->K));
  std::printf("- DRAM read (same run): %.1f GB/s at %d threads, streaming sum over %s, best of 3\n\n", l.dram_gbs,
              l.dram_threads, format_bytes(l.dram_bytes).c_str());
  std::printf(
      "| shape | dtype | layout | T | threads | layers | ms per layer | min ms | touched MB | GB/s | of DRAM read | "
      "tokens/s (L layers) | kernels (up projections x experts, layer 1) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const DecodeRow& r : rows)
    std::printf("| %s | %s | %s | %lld | %d | %lld | %s | %s | %s | %s | %.0f %% | %s | %s |\n", r.shape.c_str(),
                r.dtype.c_str(), r.layout.c_str(), static_cast<long long>(r.tokens), r.threads,
                static_cast<long long>(r.layers), sig3(r.ms_per_layer).c_str(), sig3(r.min_ms).c_str(),
                sig3(r.touched_bytes / 1e6).c_str(), sig3(r.gbps).c_str(), 100.0 * r.dram_fraction,
                sig3(r.tokens_per_s).c_str(), r.kernels.c_str());
  std::printf(
      "\ntouched = the distinct routed experts of the call's routing, the shared experts and the router, "
      "per call; GB/s = touched / median; tokens/s = T / (layers x median).\n");
}

void print_csv(const Header& h, const std::vector<DecodeRow>& rows) {
  std::printf(
      "shape,dtype,layout,tokens,threads,layers,ms_per_layer,min_ms,touched_bytes,gbps,dram_fraction,tokens_per_s,"
      "kernels,cpu,commit\n");
  for (const DecodeRow& r : rows)
    std::printf("%s,%s,%s,%lld,%d,%lld,%.4f,%.4f,%.0f,%.3f,%.4f,%.2f,\"%s\",\"%s\",%s\n", r.shape.c_str(),
                r.dtype.c_str(), r.layout.c_str(), static_cast<long long>(r.tokens), r.threads,
                static_cast<long long>(r.layers), r.ms_per_layer, r.min_ms, r.touched_bytes, r.gbps, r.dram_fraction,
                r.tokens_per_s, r.kernels.c_str(), h.cpu.c_str(), h.commit.c_str());
}

void print_json(const Header& h, const Limits& l, const Cache& llc, const std::vector<DecodeRow>& rows) {
  nlohmann::json j = header_json(h);
  j["mode"] = "decode";
  j["last_level_cache_bytes"] = llc.bytes;
  j["last_level_cache_source"] = llc.source;
  j["dram_read"] = {{"gbps", l.dram_gbs}, {"threads", l.dram_threads}, {"bytes", l.dram_bytes}};
  j["results"] = nlohmann::json::array();
  for (const DecodeRow& r : rows)
    j["results"].push_back({{"shape", r.shape},
                            {"dtype", r.dtype},
                            {"layout", r.layout},
                            {"tokens", r.tokens},
                            {"threads", r.threads},
                            {"layers", r.layers},
                            {"ms_per_layer", r.ms_per_layer},
                            {"min_ms", r.min_ms},
                            {"touched_bytes", r.touched_bytes},
                            {"gbps", r.gbps},
                            {"dram_fraction", r.dram_fraction},
                            {"tokens_per_s", r.tokens_per_s},
                            {"kernels", r.kernels}});
  std::printf("%s\n", j.dump(2).c_str());
}

}  // namespace

void run_decode(const Options& o) {
  const Plan p = check_options(o);
  if (o.output != "md" && o.output != "csv" && o.output != "json")
    throw std::invalid_argument("-o '" + o.output + "' is not an output format (expected md, csv or json)");
  const bool progress = isatty(STDERR_FILENO) != 0;
  const Header h = make_header(p);
  const Cache llc = last_level_cache();
  const Limits limits = measure_limits(p, progress);
  std::vector<DecodeRow> rows;
  if (!o.model.empty()) {
    rows = run_model(o.model, o.int8, p, limits, progress);
  } else {
    for (const BenchShape* s : p.shapes)
      for (const WeightFormat& d : p.dtypes)
        for (const std::string& lay : p.layouts)
          if (runs_layout(d, lay, p.layouts))
            for (DecodeRow& r : run_layers(*s, d, lay, p, limits, llc.bytes, progress)) rows.push_back(std::move(r));
  }
  if (o.output == "md")
    print_md(h, limits, llc, p.shapes, o.model, rows);
  else if (o.output == "csv")
    print_csv(h, rows);
  else
    print_json(h, limits, llc, rows);
  std::fflush(stdout);
}

}  // namespace moekit::cli::bench
