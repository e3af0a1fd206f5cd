// The one decoder every family runs (decoder.hpp): embeddings, per layer RMSNorm -> attention
// (projections, QK-norm, RoPE, the KV cache, causal / windowed / chunked softmax with optional
// sinks; or DeepSeek's MLA) -> residual -> RMSNorm -> MoE block or dense MLP -> residual; the final
// norm and the head. The public CausalLm around it is causal_lm.cpp.
// Every projection is kernels::gemm_nt on the weights as stored, in the model's compute mode.
#include "model/decoder.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "experts/weight_matrix.hpp"
#include "kernels/gemm.hpp"
#include "moekit/causal_lm.hpp"
#include "moekit/gguf.hpp"
#include "moekit/threading.hpp"
#include "moekit/tokenizer.hpp"
#include "util/error.hpp"
#include "util/thread_pool.hpp"

namespace moekit::model {
namespace {

using kernels::Output;
using kernels::RowSource;
using kernels::Threads;
using kernels::WeightMatrix;

// y [M, out] = x [M, in] Wᵀ (+ b).
void project(const Linear& l, const float* x, std::int64_t M, float* y, ComputeMode mode) {
  const std::int64_t out = l.w.rows, in = l.w.cols;
  // The bf16 mode applies to the experts; the other projections stay exact (docs/models.md).
  const ComputeMode m = mode == ComputeMode::bf16 ? ComputeMode::exact : mode;
  kernels::gemm_nt(RowSource{x, in}, weight_matrix(l.w, 0), Output{y, out}, M, out, in, Threads::pool, m);
  if (l.bias.numel() > 0) {
    const float* b = l.bias.data_as<float>();
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < out; ++j) y[i * out + j] += b[j];
  }
}

// Attention over one layer's caches: for heads [h0, h1) of kv group g and tokens [t0, t1) of a
// segment, scores = q kᵀ · scale over the keys their masks leave, softmax (with the sink), out =
// p v. Every output row is computed on its own (the kernels' row results do not depend on the
// other rows), so how the work is split, and which sequences share the pass, changes no bit.
struct AttentionTask {
  const Decoder& d;
  const Attention& at;
  const float* q;         // [T, H, hd], the pass's rows
  float* out;             // [T, H, hdv]
  std::int64_t kld, vld;  // cache: token p's key of group g at kc + p · kld + g · hd (values: vld, hdv)

  std::int64_t first_key(std::int64_t p) const {
    std::int64_t lo = 0;
    if (at.window > 0) lo = std::max<std::int64_t>(lo, p - at.window + 1);
    if (at.chunk > 0) lo = std::max<std::int64_t>(lo, p / at.chunk * at.chunk);
    return lo;
  }

  void run(const float* kc, const float* vc, std::int64_t p0, std::int64_t r0, std::int64_t g, std::int64_t h0,
           std::int64_t h1, std::int64_t t0, std::int64_t t1) const {
    const std::int64_t H = d.H, KV = d.KV, hd = d.head_dim, hdv = d.v_head_dim, Hg = H / KV, nh = h1 - h0;
    const std::int64_t rows = (t1 - t0) * nh;
    const std::int64_t lo = first_key(p0 + t0), hi = p0 + t1;  // keys [lo, hi)
    const std::int64_t n = hi - lo;
    thread_local std::vector<std::int32_t> index;
    thread_local std::vector<float> scores, scale, o;
    index.resize(static_cast<std::size_t>(rows));
    scores.resize(static_cast<std::size_t>(rows * n));
    scale.assign(static_cast<std::size_t>(rows), d.attn_scale);
    o.assign(static_cast<std::size_t>(rows * hdv), 0.0f);
    const auto head = [&](std::int64_t i) { return g * Hg + h0 + i % nh; };
    for (std::int64_t i = 0; i < rows; ++i)
      index[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((r0 + t0 + i / nh) * H + head(i));
    const WeightMatrix K{kc + lo * kld + g * hd, DType::f32, kld};
    kernels::gemm_nt(RowSource{q, hd, index.data()}, K, Output{scores.data(), n, scale.data()}, rows, n, hd,
                     Threads::caller);
    const float* sinks = at.sinks.numel() > 0 ? at.sinks.data_as<float>() : nullptr;
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t p = p0 + t0 + i / nh;
      const std::int64_t a = first_key(p) - lo, b = p - lo + 1;  // this row's keys [a, b)
      float* s = scores.data() + i * n;
      float mx = sinks ? sinks[head(i)] : -std::numeric_limits<float>::infinity();
      for (std::int64_t j = a; j < b; ++j) mx = std::max(mx, s[j]);
      float sum = sinks ? std::exp(sinks[head(i)] - mx) : 0.0f;
      for (std::int64_t j = 0; j < n; ++j) {
        const float e = j >= a && j < b ? std::exp(s[j] - mx) : 0.0f;
        s[j] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (std::int64_t j = a; j < b; ++j) s[j] *= inv;
    }
    const WeightMatrix V{vc + lo * vld + g * hdv, DType::f32, vld};
    kernels::gemm_nn(RowSource{scores.data(), n}, V, Output{o.data(), hdv}, rows, hdv, n, Threads::caller);
    for (std::int64_t i = 0; i < rows; ++i) {
      float* dst = out + ((r0 + t0 + i / nh) * H + head(i)) * hdv;
      std::copy_n(o.data() + i * hdv, hdv, dst);
    }
  }

  // Every segment, group, head and token of layer l, over the pool: tasks of up to 32 tokens of a
  // segment, a group's heads split further where that leaves threads idle (decode, MQA / MLA).
  void run_all(const std::vector<Segment>& segs, std::size_t l, bool mla) const {
    constexpr std::int64_t kTokensPerTask = 32;
    const std::int64_t KV = d.KV, Hg = d.H / d.KV;
    std::int64_t blocks = 0;
    for (const Segment& s : segs) blocks += (s.n + kTokensPerTask - 1) / kTokensPerTask;
    const std::int64_t want = 2 * static_cast<std::int64_t>(num_threads());
    const std::int64_t split = std::clamp<std::int64_t>((want + KV * blocks - 1) / (KV * blocks), 1, Hg);
    const std::int64_t per = (Hg + split - 1) / split;
    struct Block {
      const Segment* seg;
      std::int64_t t0, t1;
    };
    std::vector<Block> work;
    for (const Segment& s : segs)
      for (std::int64_t t = 0; t < s.n; t += kTokensPerTask) work.push_back({&s, t, std::min(s.n, t + kTokensPerTask)});
    detail::parallel_tasks(static_cast<std::int64_t>(work.size()) * KV * split, [&](std::int64_t i) {
      const std::int64_t g = i % KV, sp = i / KV % split;
      const Block& b = work[static_cast<std::size_t>(i / KV / split)];
      const std::int64_t h0 = sp * per, h1 = std::min(Hg, h0 + per);
      const float* kc = (*b.seg->k)[l].data_as<float>();
      const float* vc = mla ? kc : (*b.seg->v)[l].data_as<float>();
      if (h0 < h1) run(kc, vc, b.seg->p0, b.seg->t0, g, h0, h1, b.t0, b.t1);
    });
  }
};

// RMSNorm of each of `rows` rows of width n.
void norm_rows(const float* x, const Tensor& w, std::int64_t rows, std::int64_t n, double eps, float* y) {
  const float* wp = w.numel() > 0 ? w.data_as<float>() : nullptr;
  for (std::int64_t i = 0; i < rows; ++i) rms_norm(x + i * n, wp, n, eps, y + i * n);
}

// Queries and keys normalised, rotated and (Llama-4's NoPE layers) temperature-scaled.
void prepare_qk(const Decoder& d, const Attention& at, std::int64_t T, const std::int64_t* pos, float* q, float* k) {
  const std::int64_t H = d.H, KV = d.KV, hd = d.head_dim;
  switch (at.qk_norm) {
    case QkNorm::per_head:
      norm_rows(q, at.q_norm, T * H, hd, d.rms_eps, q);
      norm_rows(k, at.k_norm, T * KV, hd, d.rms_eps, k);
      break;
    case QkNorm::whole:
      norm_rows(q, at.q_norm, T, H * hd, d.rms_eps, q);
      norm_rows(k, at.k_norm, T, KV * hd, d.rms_eps, k);
      break;
    case QkNorm::none:
    case QkNorm::l2:
      break;
  }
  if (at.rope) {
    for (std::int64_t t = 0; t < T; ++t) {
      for (std::int64_t h = 0; h < H; ++h) apply_rope(d.rope, pos[t], q + (t * H + h) * hd);
      for (std::int64_t h = 0; h < KV; ++h) apply_rope(d.rope, pos[t], k + (t * KV + h) * hd);
    }
  }
  if (at.qk_norm == QkNorm::l2) {  // after the rotation (Llama-4)
    const Tensor none;
    norm_rows(q, none, T * H, hd, d.rms_eps, q);
    norm_rows(k, none, T * KV, hd, d.rms_eps, k);
  }
  if (at.temperature_tuning) {
    for (std::int64_t t = 0; t < T; ++t) {
      const double p = static_cast<double>(pos[t]);
      const float s =
          static_cast<float>(std::log(std::floor((p + 1.0) / d.temp_floor_scale) + 1.0) * d.temp_attn_scale + 1.0);
      for (std::int64_t i = 0; i < H * hd; ++i) q[t * H * hd + i] *= s;
    }
  }
}

// MLA (decoder.hpp, Mla) for the pass's T rows at positions pos: appends each segment's latent rows
// to its cache of layer l ([ctx, kv_lora + rope]) and leaves the heads' outputs in o [T, H, v].
void mla_attention(const Decoder& d, const Attention& at, const float* a, std::int64_t T, const std::int64_t* pos,
                   const std::vector<Segment>& segs, std::size_t l, float* o, ComputeMode mode) {
  const Mla& m = *at.mla;
  const std::int64_t H = d.H, R = m.row(), qk = m.nope + m.rope, L = m.kv_lora;
  const ComputeMode pm = mode == ComputeMode::bf16 ? ComputeMode::exact : mode;
  std::vector<float> q(static_cast<std::size_t>(T * H * qk));
  if (m.q_lora > 0) {
    std::vector<float> qa(static_cast<std::size_t>(T * m.q_lora));
    project(m.q_a, a, T, qa.data(), mode);
    norm_rows(qa.data(), m.q_a_norm, T, m.q_lora, d.rms_eps, qa.data());
    project(m.q_b, qa.data(), T, q.data(), mode);
  } else {
    project(at.q, a, T, q.data(), mode);
  }
  std::vector<float> rows(static_cast<std::size_t>(T * R));  // [c ‖ k_pe] of each row
  project(m.kv_a, a, T, rows.data(), mode);
  for (std::int64_t t = 0; t < T; ++t) {
    float* r = rows.data() + t * R;
    rms_norm(r, m.kv_a_norm.data_as<float>(), L, d.rms_eps, r);
    apply_rope(d.rope, pos[t], r + L);
  }
  for (const Segment& s : segs) std::copy_n(rows.data() + s.t0 * R, s.n * R, (*s.k)[l].data_as<float>() + s.p0 * R);
  // Queries in the latent space: [W_kᵀ q_nope ‖ rope(q_pe)] per head.
  std::vector<float> qabs(static_cast<std::size_t>(T * H * R)), lat(static_cast<std::size_t>(T * H * L));
  detail::parallel_tasks(H, [&](std::int64_t h) {
    kernels::gemm_nt(RowSource{q.data() + h * qk, H * qk}, weight_matrix(m.k_b, h), Output{qabs.data() + h * R, H * R},
                     T, L, m.nope, Threads::caller, pm);
    for (std::int64_t t = 0; t < T; ++t) {
      float* pe = qabs.data() + (t * H + h) * R + L;
      std::copy_n(q.data() + (t * H + h) * qk + m.nope, m.rope, pe);
      apply_rope(d.rope, pos[t], pe);
    }
  });
  // One key head over the latent rows; the values are their first kv_lora elements.
  const AttentionTask task{d, at, qabs.data(), lat.data(), R, R};
  task.run_all(segs, l, /*mla=*/true);
  detail::parallel_tasks(H, [&](std::int64_t h) {
    kernels::gemm_nt(RowSource{lat.data() + h * L, H * L}, weight_matrix(m.v_b, h), Output{o + h * m.v, H * m.v}, T,
                     m.v, L, Threads::caller, pm);
  });
}

}  // namespace

void attach_tokenizer(Decoder& d, const std::function<std::shared_ptr<const Tokenizer>()>& read) {
  try {
    d.tokenizer = read();
    d.info.tokenizer = d.tokenizer->describe();
  } catch (const std::exception& e) {
    d.tokenizer = nullptr;
    d.info.tokenizer = std::string("none: ") + e.what();
  }
}

void use_latent_cache(Decoder& d, const Mla& m) {
  d.KV = 1;
  d.head_dim = m.row();
  d.v_head_dim = m.kv_lora;
  d.info.num_kv_heads = 1;
}

void split_kv_b(const ExpertMatrix& kv_b, std::int64_t H, Mla& m, std::vector<std::shared_ptr<const void>>& keep) {
  const std::int64_t per = m.nope + m.v, L = m.kv_lora;
  const WeightMatrix w = weight_matrix(kv_b, 0);
  auto k = std::make_shared<std::vector<float>>(static_cast<std::size_t>(H * L * m.nope));
  auto v = std::make_shared<std::vector<float>>(static_cast<std::size_t>(H * m.v * L));
  std::vector<float> rows(static_cast<std::size_t>(per * L));
  for (std::int64_t h = 0; h < H; ++h) {
    if (kv_b.quantized()) {
      kernels::dequantize_rows(w, h * per, per, L, rows.data());
    } else {
      for (std::int64_t r = 0; r < per; ++r)
        for (std::int64_t c = 0; c < L; ++c)
          rows[r * L + c] = kernels::load_f32(w.data, w.dtype, (h * per + r) * w.ld + c);
    }
    float* kh = k->data() + h * L * m.nope;
    for (std::int64_t n = 0; n < m.nope; ++n)
      for (std::int64_t c = 0; c < L; ++c) kh[c * m.nope + n] = rows[n * L + c];
    std::copy_n(rows.data() + m.nope * L, m.v * L, v->data() + h * m.v * L);
  }
  const auto view = [&](const std::vector<float>& data, std::int64_t r, std::int64_t c) {
    ExpertMatrix e;
    e.dtype = DType::f32;
    e.rows = r;
    e.cols = c;
    e.row_stride = c;
    for (std::int64_t h = 0; h < H; ++h) e.experts.push_back(data.data() + h * r * c);
    return e;
  };
  m.k_b = view(*k, L, m.nope);
  m.v_b = view(*v, m.v, L);
  keep.push_back(k);
  keep.push_back(v);
}

std::int64_t cache_bytes_per_token(const Decoder& d) {
  std::int64_t floats = 0;
  for (const Layer& l : d.layers) floats += l.attn.mla ? l.attn.mla->row() : d.KV * (d.head_dim + d.v_head_dim);
  return floats * static_cast<std::int64_t>(sizeof(float));
}

std::string describe_attention(const Decoder& d) {
  std::vector<std::string> parts;
  const Attention& a0 = d.layers.front().attn;
  if (const Mla* m = a0.mla.get())
    parts.push_back(
        MOEKIT_MSG("MLA: " << (m->q_lora > 0 ? "q LoRA " + std::to_string(m->q_lora) : std::string("q direct"))
                           << ", kv LoRA " << m->kv_lora << " + rope " << m->rope << " cached per token, nope "
                           << m->nope << ", v " << m->v << ", absorbed"));
  if (a0.q.bias.numel() > 0) parts.push_back("q/k/v biases");
  if (a0.o.bias.numel() > 0) parts.push_back("output bias");
  for (const Layer& l : d.layers)
    if (l.attn.qk_norm != QkNorm::none) {
      parts.push_back(l.attn.qk_norm == QkNorm::per_head ? "qk-norm per head"
                      : l.attn.qk_norm == QkNorm::whole  ? "qk-norm over the projection"
                                                         : "l2 qk-norm on rope layers");
      break;
    }
  if (a0.sinks.numel() > 0) parts.push_back("sinks");
  std::vector<std::int64_t> windowed, nope, chunked;
  std::int64_t window = 0, chunk = 0;
  for (std::size_t l = 0; l < d.layers.size(); ++l) {
    const Attention& a = d.layers[l].attn;
    if (a.window > 0) windowed.push_back(static_cast<std::int64_t>(l)), window = a.window;
    if (a.chunk > 0) chunked.push_back(static_cast<std::int64_t>(l)), chunk = a.chunk;
    if (!a.rope) nope.push_back(static_cast<std::int64_t>(l));
  }
  if (!windowed.empty()) parts.push_back(MOEKIT_MSG("window " << window << " on layers " << compact_ranges(windowed)));
  if (!chunked.empty()) parts.push_back(MOEKIT_MSG("chunks of " << chunk << " on layers " << compact_ranges(chunked)));
  if (!nope.empty()) parts.push_back("NoPE + temperature tuning on layers " + compact_ranges(nope));
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s.empty() ? "plain" : s;
}

// Runs the pass's tokens ids[0, T), segment by segment (each a sequence's tokens at its positions,
// appended to its caches); leaves the final hidden states (before the final norm) in x [T, D].
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void run_layers(const Decoder& d, ComputeMode mode, const std::int32_t* ids, std::int64_t T,
                const std::vector<Segment>& segs, Tensor& x, LmStats& stats) {
  auto clock = Clock::now();
  const std::int64_t D = d.D, H = d.H, KV = d.KV, hd = d.head_dim, hdv = d.v_head_dim;
  std::vector<std::int64_t> pos(static_cast<std::size_t>(T));
  for (const Segment& s : segs)
    for (std::int64_t t = 0; t < s.n; ++t) pos[static_cast<std::size_t>(s.t0 + t)] = s.p0 + t;
  x = Tensor::uninitialized({T, D}, DType::f32);
  float* xp = x.data_as<float>();
  for (std::int64_t t = 0; t < T; ++t) {
    const WeightMatrix e = weight_matrix(d.embed, 0);
    if (d.embed.quantized()) {
      kernels::dequantize_rows(e, ids[t], 1, D, xp + t * D);
    } else {
      for (std::int64_t i = 0; i < D; ++i)
        xp[t * D + i] = kernels::load_f32(e.data, e.dtype, static_cast<std::int64_t>(ids[t]) * e.ld + i);
    }
  }
  Tensor a = Tensor::uninitialized({T, D}, DType::f32);
  const Mla* mla = d.layers.front().attn.mla.get();  // MLA models are MLA in every layer
  Tensor q, k, v;
  if (!mla) {
    q = Tensor::uninitialized({T, H * hd}, DType::f32);
    k = Tensor::uninitialized({T, KV * hd}, DType::f32);
    v = Tensor::uninitialized({T, KV * hdv}, DType::f32);
  }
  Tensor o = Tensor::uninitialized({T, H * (mla ? mla->v : hdv)}, DType::f32);
  Tensor y = Tensor::uninitialized({T, D}, DType::f32);
  stats.head_ms += ms_since(clock);
  for (std::size_t l = 0; l < d.layers.size(); ++l) {
    clock = Clock::now();
    const Layer& layer = d.layers[l];
    const Attention& at = layer.attn;
    norm_rows(xp, layer.attn_norm, T, D, d.rms_eps, a.data_as<float>());
    if (at.mla) {
      mla_attention(d, at, a.data_as<float>(), T, pos.data(), segs, l, o.data_as<float>(), mode);
    } else {
      project(at.q, a.data_as<float>(), T, q.data_as<float>(), mode);
      project(at.k, a.data_as<float>(), T, k.data_as<float>(), mode);
      project(at.v, a.data_as<float>(), T, v.data_as<float>(), mode);
      prepare_qk(d, at, T, pos.data(), q.data_as<float>(), k.data_as<float>());
      for (const Segment& s : segs) {
        std::copy_n(k.data_as<float>() + s.t0 * KV * hd, s.n * KV * hd, (*s.k)[l].data_as<float>() + s.p0 * KV * hd);
        std::copy_n(v.data_as<float>() + s.t0 * KV * hdv, s.n * KV * hdv, (*s.v)[l].data_as<float>() + s.p0 * KV * hdv);
      }
      const AttentionTask task{d, at, q.data_as<float>(), o.data_as<float>(), KV * hd, KV * hdv};
      task.run_all(segs, l, /*mla=*/false);
    }
    project(at.o, o.data_as<float>(), T, y.data_as<float>(), mode);
    for (std::int64_t i = 0; i < T * D; ++i) xp[i] += y.data_as<float>()[i];
    norm_rows(xp, layer.ffn_norm, T, D, d.rms_eps, a.data_as<float>());
    stats.attention_ms += ms_since(clock);
    clock = Clock::now();
    if (layer.moe) {
      const Tensor f = layer.moe->forward(a);
      for (std::int64_t i = 0; i < T * D; ++i) xp[i] += f.data_as<float>()[i];
      stats.moe_ms += ms_since(clock);
    } else {
      run_dense_ffn(layer.dense, layer.dense_body, a, x, /*accumulate=*/true, nullptr, mode);
      stats.dense_ffn_ms += ms_since(clock);
    }
  }
}

// The final norm and the head on rows [first, first + rows) of x, into out [rows, V].
void head(const Decoder& d, ComputeMode mode, const Tensor& x, std::int64_t first, std::int64_t rows, float* out) {
  const std::int64_t D = d.D, V = d.vocab;
  Tensor normed = Tensor::uninitialized({rows, D}, DType::f32);
  for (std::int64_t i = 0; i < rows; ++i)
    rms_norm(x.data_as<float>() + (first + i) * D, d.output_norm.data_as<float>(), D, d.rms_eps,
             normed.data_as<float>() + i * D);
  const ComputeMode m = mode == ComputeMode::bf16 ? ComputeMode::exact : mode;
  kernels::gemm_nt(kernels::RowSource{normed.data_as<float>(), D}, weight_matrix(d.head, 0), kernels::Output{out, V},
                   rows, V, D, kernels::Threads::pool, m);
}

}  // namespace moekit::model
