// moekit::CausalLm, the public face of the one decoder (decoder.hpp): opening a model from its file,
// sequences and their caches, forward (one sequence's tokens, in prefill chunks), decode (several
// sequences' steps in one pass), generation and the time statistics.
#include "moekit/causal_lm.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "model/decoder.hpp"
#include "moekit/gguf.hpp"
#include "moekit/tokenizer.hpp"
#include "util/error.hpp"

namespace moekit {

struct CausalLm::Impl {
  model::Decoder d;
  LmOptions options;
  // Forwards of different sequences may run at once (Python threads): each sums its times locally
  // and adds them here under the lock.
  mutable std::mutex stats_mutex;
  mutable LmStats stats;
  void add(const LmStats& s) const {
    const std::lock_guard<std::mutex> lock(stats_mutex);
    stats.moe_ms += s.moe_ms;
    stats.dense_ffn_ms += s.dense_ffn_ms;
    stats.attention_ms += s.attention_ms;
    stats.head_ms += s.head_ms;
    stats.tokens += s.tokens;
  }
};

Sequence::~Sequence() = default;

void Sequence::truncate(std::int64_t n) {
  if (n < 0 || n > n_)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::Sequence::truncate] " << n << " outside [0, " << n_ << "]"));
  n_ = n;
}

std::size_t Sequence::nbytes() const noexcept {
  std::size_t b = 0;
  for (const Tensor& t : k_) b += t.nbytes();
  for (const Tensor& t : v_) b += t.nbytes();
  return b;
}

CausalLm::~CausalLm() = default;

namespace {

// A model's state: the options (an unset mode settled to `fallback`), the decoder `read` makes from
// them, and the descriptions every model carries.
std::unique_ptr<CausalLm::Impl> build(const LmOptions& options, ComputeMode fallback,
                                      const std::function<model::Decoder(const LmOptions&)>& read) {
  if (options.prefill_chunk < 1)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm] prefill_chunk " << options.prefill_chunk << " < 1"));
  auto impl = std::make_unique<CausalLm::Impl>();
  LmOptions& o = impl->options;
  o = options;
  if (!o.mode) o.mode = fallback;
  model::Decoder& d = impl->d;
  d = read(o);
  d.info.attention = model::describe_attention(d);
  d.info.cache_bytes_per_token = model::cache_bytes_per_token(d);
  o.ctx = d.info.ctx;
  return impl;
}

}  // namespace

std::shared_ptr<CausalLm> CausalLm::open(const std::string& path, const LmOptions& options) {
  const bool gguf = is_gguf_path(path);
  std::shared_ptr<CausalLm> lm(new CausalLm());
  lm->impl_ = build(options, gguf ? ComputeMode::int8 : ComputeMode::exact,
                    [&](const LmOptions& o) { return gguf ? model::read_gguf(path, o) : model::read_hf(path, o); });
  return lm;
}

LmStats CausalLm::stats() const {
  const std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  return impl_->stats;
}
void CausalLm::reset_stats() const {
  const std::lock_guard<std::mutex> lock(impl_->stats_mutex);
  impl_->stats = LmStats{};
}

std::shared_ptr<CausalLm> CausalLm::random(std::uint64_t seed, const LmOptions& options) {
  std::shared_ptr<CausalLm> lm(new CausalLm());
  lm->impl_ = build(options, ComputeMode::exact, [&](const LmOptions& o) { return model::random_decoder(seed, o); });
  return lm;
}

const LmInfo& CausalLm::info() const noexcept { return impl_->d.info; }
const LmOptions& CausalLm::options() const noexcept { return impl_->options; }
std::shared_ptr<const Tokenizer> CausalLm::tokenizer() const noexcept { return impl_->d.tokenizer; }

std::unique_ptr<Sequence> CausalLm::new_sequence() const {
  const model::Decoder& d = impl_->d;
  std::unique_ptr<Sequence> s(new Sequence());
  s->ctx_ = d.info.ctx;
  for (std::size_t l = 0; l < d.layers.size(); ++l) {
    s->k_.push_back(Tensor::uninitialized({s->ctx_, d.KV, d.head_dim}, DType::f32));
    // MLA: one latent row per token ([ctx, 1, kv_lora + rope]), no separate values.
    s->v_.push_back(d.layers[l].attn.mla ? Tensor() : Tensor::uninitialized({s->ctx_, d.KV, d.v_head_dim}, DType::f32));
  }
  return s;
}

Tensor CausalLm::forward(Sequence& seq, const std::vector<std::int32_t>& ids, bool all_logits) const {
  const model::Decoder& d = impl_->d;
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  if (T == 0) throw std::invalid_argument("[moekit::CausalLm::forward] no tokens");
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= d.vocab)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm::forward] token id "
                                             << ids[i] << " at " << i << " outside the vocabulary [0, " << d.vocab
                                             << ")"));
  if (seq.k_.size() != d.layers.size() || seq.ctx_ != d.info.ctx)
    throw std::invalid_argument("[moekit::CausalLm::forward] the sequence was made by another model");
  if (seq.n_ + T > seq.ctx_)
    throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm::forward] " << seq.n_ << " + " << T
                                                                          << " tokens pass the context of " << seq.ctx_
                                                                          << " (--ctx)"));
  const std::int64_t V = d.vocab;
  Tensor logits = Tensor::uninitialized({all_logits ? T : 1, V}, DType::f32);
  const ComputeMode mode = impl_->options.mode.value_or(ComputeMode::exact);
  Tensor x;
  LmStats stats;
  for (std::int64_t c0 = 0; c0 < T; c0 += impl_->options.prefill_chunk) {
    const std::int64_t n = std::min(impl_->options.prefill_chunk, T - c0);
    model::run_layers(d, mode, ids.data() + c0, n, {model::Segment{&seq.k_, &seq.v_, seq.n_, 0, n}}, x, stats);
    seq.n_ += n;
    stats.tokens += n;
    // The head on the rows asked for: all of them, or the last token's.
    if (!all_logits && c0 + n < T) continue;
    const auto t_head = model::Clock::now();
    const std::int64_t first = all_logits ? 0 : n - 1;
    model::head(d, mode, x, first, n - first, logits.data_as<float>() + (all_logits ? c0 : 0) * V);
    stats.head_ms += model::ms_since(t_head);
  }
  impl_->add(stats);
  return logits;
}

Tensor CausalLm::step(const std::vector<Sequence*>& seqs, const std::vector<std::vector<std::int32_t>>& ids) const {
  const model::Decoder& d = impl_->d;
  const std::int64_t B = static_cast<std::int64_t>(seqs.size());
  if (B == 0) throw std::invalid_argument("[moekit::CausalLm::step] no sequences");
  if (ids.size() != seqs.size())
    throw std::invalid_argument(
        MOEKIT_MSG("[moekit::CausalLm::step] " << ids.size() << " token lists for " << B << " sequences"));
  // Every check before anything is appended: a refused step changes no sequence.
  std::vector<model::Segment> segs;
  std::vector<std::int32_t> all;
  for (std::int64_t i = 0; i < B; ++i) {
    Sequence* s = seqs[static_cast<std::size_t>(i)];
    const std::vector<std::int32_t>& list = ids[static_cast<std::size_t>(i)];
    if (s == nullptr) throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm::step] sequence " << i << " is null"));
    if (list.empty()) throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm::step] no tokens for sequence " << i));
    for (const std::int32_t id : list)
      if (id < 0 || id >= d.vocab)
        throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm::step] token id " << id << " of sequence " << i
                                                                                    << " outside the vocabulary [0, "
                                                                                    << d.vocab << ")"));
    if (s->k_.size() != d.layers.size() || s->ctx_ != d.info.ctx)
      throw std::invalid_argument(
          MOEKIT_MSG("[moekit::CausalLm::step] sequence " << i << " was made by another model"));
    const auto n = static_cast<std::int64_t>(list.size());
    if (s->n_ >= s->ctx_)
      throw std::invalid_argument(
          MOEKIT_MSG("[moekit::CausalLm::step] sequence " << i << " is full: its " << s->ctx_ << " tokens (--ctx)"));
    if (s->n_ + n > s->ctx_)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm::step] sequence " << i << ": " << s->n_ << " + " << n
                                                                                  << " tokens pass its context of "
                                                                                  << s->ctx_ << " (--ctx)"));
    for (std::int64_t j = 0; j < i; ++j)
      if (seqs[static_cast<std::size_t>(j)] == s)
        throw std::invalid_argument(
            MOEKIT_MSG("[moekit::CausalLm::step] sequences " << j << " and " << i << " are the same sequence"));
    segs.push_back(model::Segment{&s->k_, &s->v_, s->n_, static_cast<std::int64_t>(all.size()), n});
    all.insert(all.end(), list.begin(), list.end());
  }
  const ComputeMode mode = impl_->options.mode.value_or(ComputeMode::exact);
  const auto T = static_cast<std::int64_t>(all.size());
  Tensor x;
  LmStats stats;
  model::run_layers(d, mode, all.data(), T, segs, x, stats);
  for (std::int64_t i = 0; i < B; ++i) seqs[static_cast<std::size_t>(i)]->n_ += segs[static_cast<std::size_t>(i)].n;
  stats.tokens += T;
  const auto t_head = model::Clock::now();
  // The head on each sequence's last row, all B rows in one call (its weights read once).
  if (T != B) {
    const std::int64_t D = x.dim(1);
    Tensor last = Tensor::uninitialized({B, D}, DType::f32);
    for (std::int64_t i = 0; i < B; ++i) {
      const model::Segment& g = segs[static_cast<std::size_t>(i)];
      std::memcpy(last.data_as<float>() + i * D, x.data_as<const float>() + (g.t0 + g.n - 1) * D,
                  static_cast<std::size_t>(D) * sizeof(float));
    }
    x = std::move(last);
  }
  Tensor logits = Tensor::uninitialized({B, d.vocab}, DType::f32);
  model::head(d, mode, x, 0, B, logits.data_as<float>());
  stats.head_ms += model::ms_since(t_head);
  impl_->add(stats);
  return logits;
}

Tensor CausalLm::decode(const std::vector<Sequence*>& seqs, const std::vector<std::int32_t>& ids) const {
  if (ids.size() != seqs.size())
    throw std::invalid_argument(
        MOEKIT_MSG("[moekit::CausalLm::decode] " << ids.size() << " token ids for " << seqs.size() << " sequences"));
  std::vector<std::vector<std::int32_t>> lists;
  lists.reserve(ids.size());
  for (const std::int32_t id : ids) lists.push_back({id});
  return step(seqs, lists);
}

std::vector<std::int32_t> CausalLm::generate(const std::vector<std::int32_t>& prompt, std::int64_t max_tokens,
                                             const SamplingParams& sampling, const TokenCallback& on_token,
                                             GenerateTimings* timings) const {
  if (prompt.empty()) throw std::invalid_argument("[moekit::CausalLm::generate] empty prompt");
  if (max_tokens < 0) throw std::invalid_argument("[moekit::CausalLm::generate] max_tokens < 0");
  validate(sampling);
  std::unique_ptr<Sequence> seq = new_sequence();
  if (static_cast<std::int64_t>(prompt.size()) > seq->capacity())
    throw std::invalid_argument(MOEKIT_MSG("[moekit::CausalLm::generate] the prompt's "
                                           << prompt.size() << " tokens pass the context of " << seq->capacity()
                                           << " (--ctx)"));
  using clock = std::chrono::steady_clock;
  GenerateTimings tm;
  tm.prompt_tokens = static_cast<std::int64_t>(prompt.size());
  const auto t0 = clock::now();
  Tensor logits = forward(*seq, prompt);
  const auto t1 = clock::now();
  tm.prefill_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  Sampler sampler(sampling);
  std::vector<std::int32_t> history = prompt, out;
  const Tokenizer* tok = impl_->d.tokenizer.get();  // its end-of-generation ids stop the generation
  const std::int64_t V = impl_->d.vocab;
  const std::int64_t limit = std::min(max_tokens, seq->capacity() - seq->size());
  for (std::int64_t i = 0; i < limit; ++i) {
    const std::int32_t id = sampler.sample(logits.data_as<float>(), V, history);
    out.push_back(id);
    history.push_back(id);
    const bool stop = tok != nullptr && tok->is_end_of_generation(id);
    if (on_token && !on_token(id)) break;
    if (stop || i + 1 == limit) break;
    logits = forward(*seq, {id});
  }
  tm.generated_tokens = static_cast<std::int64_t>(out.size());
  tm.decode_ms = std::chrono::duration<double, std::milli>(clock::now() - t1).count();
  if (timings) *timings = tm;
  return out;
}

}  // namespace moekit
