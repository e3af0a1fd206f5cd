// Whole models for Python: moekit.Model, a CausalLm (causal_lm.hpp) opened from a GGUF file or a
// release folder, with logits, generation and its tokenizer (docs/python.md, "Whole models").
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <variant>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "moekit/causal_lm.hpp"
#include "moekit/tokenizer.hpp"

namespace moekit::py {

namespace {

using namespace nb::literals;

struct PyModel {
  std::shared_ptr<CausalLm> lm;
};

/// A sequence of one model: its KV cache. Holds the model, so the cache never outlives it.
struct PySequence {
  std::shared_ptr<CausalLm> lm;
  std::unique_ptr<Sequence> seq;
};

Sequence& sequence_of(const PyModel& m, PySequence& s, const char* what) {
  if (s.lm != m.lm)
    throw std::invalid_argument(std::string("[moekit.Model.") + what + "] the sequence was made by another model");
  return *s.seq;
}

// A several-sequence pass (decode, step) over `seqs` with the GIL released and the model's compute
// lock held shared: `run(raw sequences)` gives the logits, returned as a numpy array.
template <class Run>
nb::object several(const PyModel& self, const std::vector<PySequence*>& seqs, const char* what, const Run& run) {
  std::vector<Sequence*> raw;
  for (PySequence* s : seqs) {
    if (s == nullptr) throw std::invalid_argument(std::string("[moekit.Model.") + what + "] a sequence is None");
    raw.push_back(&sequence_of(self, *s, what));
  }
  Tensor out;
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    out = run(raw);
  }
  return export_tensor(std::move(out), Framework::numpy);
}

struct PyTextStream {
  TextStream stream;
};

LmOptions options_of(std::int64_t ctx, const std::string& mode) {
  LmOptions o;
  o.ctx = ctx;
  if (mode == "auto") return o;  // the file's own arithmetic (LmOptions::mode)
  const std::optional<ComputeMode> m = compute_mode_from_name(mode);
  if (!m) throw std::invalid_argument("[moekit.Model] mode '" + mode + "' is not one of auto, exact, int8, bf16");
  o.mode = *m;
  return o;
}

const Tokenizer& tokenizer_of(const PyModel& m, const char* what) {
  const std::shared_ptr<const Tokenizer> t = m.lm->tokenizer();
  if (!t)
    throw std::invalid_argument(std::string("[moekit.Model.") + what + "] the model has no tokenizer moekit reads (" +
                                m.lm->info().path + "); pass token ids");
  return *t;
}

/// The text of `ids` as valid UTF-8 (bytes that form no character as U+FFFD), so that Python's
/// str accepts it.
std::string text_of(const std::shared_ptr<const Tokenizer>& tok, const std::vector<std::int32_t>& ids) {
  TextStream stream(tok);
  std::string text;
  for (const std::int32_t id : ids) text += stream.push(id);
  return text + stream.flush();
}

/// A prompt given as text (tokenized with the model's own BOS rule and special tokens) or as ids.
using Prompt = std::variant<std::string, std::vector<std::int32_t>>;

std::vector<std::int32_t> prompt_ids(const PyModel& m, const Prompt& prompt) {
  if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&prompt)) return *ids;
  return tokenizer_of(m, "generate").encode(std::get<std::string>(prompt));
}

nb::dict info_dict(const LmInfo& i) {
  nb::dict d;
  d["arch"] = i.arch;
  d["path"] = i.path;
  d["num_layers"] = i.num_layers;
  d["hidden_size"] = i.hidden_size;
  d["vocab_size"] = i.vocab_size;
  d["num_heads"] = i.num_heads;
  d["num_kv_heads"] = i.num_kv_heads;
  d["head_dim"] = i.head_dim;
  d["train_ctx"] = i.train_ctx;
  d["ctx"] = i.ctx;
  d["moe_layers"] = i.moe_layers;
  d["rope"] = i.rope;
  d["attention"] = i.attention;
  d["mtp_layers"] = i.mtp_layers;
  d["cache_bytes_per_token"] = i.cache_bytes_per_token;
  return d;
}

/// Python's sampling keywords as SamplingParams, checked (ValueError naming the one out of range).
SamplingParams sampling_params(double temperature, std::int64_t top_k, double top_p, double min_p,
                               double repetition_penalty, std::int64_t repeat_last_n, std::uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repetition_penalty;
  p.repeat_last_n = repeat_last_n;
  p.seed = seed;
  validate(p);
  return p;
}

nb::dict generate(const PyModel& m, const Prompt& prompt, std::int64_t max_tokens, double temperature,
                  std::int64_t top_k, double top_p, double min_p, double repetition_penalty, std::uint64_t seed,
                  const std::optional<nb::callable>& on_token) {
  const std::vector<std::int32_t> ids = prompt_ids(m, prompt);
  const SamplingParams p =
      sampling_params(temperature, top_k, top_p, min_p, repetition_penalty, SamplingParams{}.repeat_last_n, seed);
  const std::shared_ptr<const Tokenizer> tok = m.lm->tokenizer();
  std::optional<TextStream> stream;
  if (tok) stream.emplace(tok);
  // The callback runs Python: it takes the GIL back for each token; a Python exception in it ends
  // the generation and propagates (nanobind's python_error, rethrown after the GIL comes back).
  // It stops the generation by returning False; None (a callback that only prints) goes on.
  TokenCallback cb;
  if (on_token)
    cb = [&](std::int32_t id) {
      const std::string piece = stream ? stream->push(id) : std::string();
      nb::gil_scoped_acquire acquire;
      const nb::object r = (*on_token)(id, nb::str(piece.data(), piece.size()));
      if (r.is_none()) return true;
      const int truth = PyObject_IsTrue(r.ptr());
      if (truth < 0) throw nb::python_error();
      return truth == 1;
    };
  GenerateTimings tm;
  std::vector<std::int32_t> out;
  {
    nb::gil_scoped_release release;
    std::shared_lock lock(compute_mutex());
    out = m.lm->generate(ids, max_tokens, p, cb, &tm);
  }
  nb::dict d;
  d["prompt_ids"] = ids;
  d["ids"] = out;
  if (tok) {
    const std::string text = text_of(tok, out);
    d["text"] = nb::str(text.data(), text.size());
  } else {
    d["text"] = nb::none();
  }
  nb::dict t;
  t["prefill_ms"] = tm.prefill_ms;
  t["prefill_tokens_per_s"] = tm.prefill_ms > 0 ? 1e3 * static_cast<double>(tm.prompt_tokens) / tm.prefill_ms : 0.0;
  t["decode_ms"] = tm.decode_ms;
  // The first token comes from the prefill's logits: decode made generated - 1 forwards.
  t["decode_tokens_per_s"] = tm.decode_ms > 0 && tm.generated_tokens > 1
                                 ? 1e3 * static_cast<double>(tm.generated_tokens - 1) / tm.decode_ms
                                 : 0.0;
  d["timings"] = t;
  return d;
}

}  // namespace

void bind_serving(nb::module_& m) {
  nb::class_<PySequence>(m, "Sequence",
                         "One sequence's KV cache (Model.new_sequence): the tokens run so far, appended by\n"
                         "Model.forward and Model.decode.")
      .def_prop_ro(
          "size", [](const PySequence& s) { return s.seq->size(); }, "Tokens in the cache.")
      .def_prop_ro(
          "capacity", [](const PySequence& s) { return s.seq->capacity(); }, "The context it holds.")
      .def_prop_ro(
          "nbytes", [](const PySequence& s) { return s.seq->nbytes(); }, "Bytes of its cache.")
      .def(
          "truncate", [](PySequence& s, std::int64_t n) { s.seq->truncate(n); }, "n"_a,
          "Forgets the tokens from n on (0 empties it).")
      .def("__len__", [](const PySequence& s) { return s.seq->size(); });

  nb::class_<Sampler>(m, "Sampler",
                      "Draws tokens from logits as moekit generate does (repetition penalty, top-k, top-p,\n"
                      "min-p, temperature; greedy at temperature 0), deterministic for a seed.")
      .def(
          "__init__",
          [](Sampler* self, double temperature, std::int64_t top_k, double top_p, double min_p,
             double repetition_penalty, std::int64_t repeat_last_n, std::uint64_t seed) {
            new (self)
                Sampler(sampling_params(temperature, top_k, top_p, min_p, repetition_penalty, repeat_last_n, seed));
          },
          nb::kw_only(), "temperature"_a = 0.0, "top_k"_a = 0, "top_p"_a = 1.0, "min_p"_a = 0.0,
          "repetition_penalty"_a = 1.0, "repeat_last_n"_a = 64, "seed"_a = 0)
      .def(
          "sample",
          [](Sampler& self, nb::handle logits, const std::vector<std::int32_t>& history) {
            const InputArray a = import_array(logits, "logits");
            if (a.view.dtype() != DType::f32 || a.view.numel() < 1)
              throw std::invalid_argument("[moekit.Sampler.sample] logits must be a non-empty float32 array");
            std::int32_t id = 0;
            {
              nb::gil_scoped_release release;
              id = self.sample(a.view.data_as<float>(), a.view.numel(), history);
            }
            return id;
          },
          "logits"_a, "history"_a = std::vector<std::int32_t>{},
          "The next token id from one row of logits (float32) and the sequence's tokens so far.");

  nb::class_<PyTextStream>(m, "TextStream",
                           "Streaming detokenization (Model.text_stream): push(id) returns the text that token\n"
                           "completes (whole UTF-8 characters), flush() what is held back.")
      .def(
          "push",
          [](PyTextStream& s, std::int32_t id) {
            const std::string t = s.stream.push(id);
            return nb::str(t.data(), t.size());
          },
          "id"_a)
      .def("flush", [](PyTextStream& s) {
        const std::string t = s.stream.flush();
        return nb::str(t.data(), t.size());
      });
}

void bind_model(nb::module_& m) {
  nb::class_<PyModel>(m, "Model",
                      "A whole model (docs/models.md): a GGUF file (any part of a split model) or a release\n"
                      "folder, weights used in place. mode: 'auto' (default: int8 for a GGUF, as ggml computes;\n"
                      "exact for a folder), 'exact', 'int8' or 'bf16' for every projection; ctx: the context\n"
                      "of its sequences (0: the model's, capped at 4096).\n"
                      "Safe to call from several Python threads (each call runs its own sequence).")
      .def(
          "__init__",
          [](PyModel* self, const std::string& path, std::int64_t ctx, const std::string& mode) {
            const LmOptions o = options_of(ctx, mode);
            std::shared_ptr<CausalLm> lm;
            {
              nb::gil_scoped_release release;
              lm = CausalLm::open(path, o);
            }
            new (self) PyModel{std::move(lm)};
          },
          "path"_a, nb::kw_only(), "ctx"_a = 0, "mode"_a = "auto")
      .def_static(
          "random",
          [](std::uint64_t seed, std::int64_t ctx, const std::string& mode) {
            return PyModel{CausalLm::random(seed, options_of(ctx, mode))};
          },
          "seed"_a = 1, nb::kw_only(), "ctx"_a = 0, "mode"_a = "exact",
          "The demo's small Qwen3-MoE-shaped model with random weights from `seed` (no file, no tokenizer).")
      .def_prop_ro(
          "info", [](const PyModel& self) { return info_dict(self.lm->info()); },
          "{'arch', 'num_layers', 'hidden_size', 'vocab_size', 'ctx', 'rope', 'attention', ...}")
      .def_prop_ro("vocab_size", [](const PyModel& self) { return self.lm->info().vocab_size; })
      .def_prop_ro("has_tokenizer", [](const PyModel& self) { return self.lm->tokenizer() != nullptr; })
      .def(
          "logits",
          [](const PyModel& self, const std::vector<std::int32_t>& ids) {
            Tensor out;
            {
              nb::gil_scoped_release release;
              std::shared_lock lock(compute_mutex());
              std::unique_ptr<Sequence> seq = self.lm->new_sequence();
              out = self.lm->forward(*seq, ids, /*all_logits=*/true);
            }
            return export_tensor(std::move(out), Framework::numpy);
          },
          "ids"_a, "float32 numpy logits [len(ids), vocab_size] of a fresh sequence (causal: row i sees ids[:i+1]).")
      .def("generate", &generate, "prompt"_a, nb::kw_only(), "max_tokens"_a = 128, "temperature"_a = 0.0, "top_k"_a = 0,
           "top_p"_a = 1.0, "min_p"_a = 0.0, "repetition_penalty"_a = 1.0, "seed"_a = 0, "on_token"_a = nb::none(),
           "Continues `prompt` (text, tokenized with the model's BOS rule and special tokens, or a list\n"
           "of ids): greedy by default, sampled with temperature > 0; stops after an end-of-generation\n"
           "token or max_tokens. on_token(id, text) is called per token with the text that token\n"
           "completes (whole UTF-8 characters; '' without a tokenizer); returning False stops (None\n"
           "goes on).\n"
           "Returns {'prompt_ids', 'ids', 'text' (None without a tokenizer), 'timings'}.")
      .def(
          "new_sequence",
          [](const PyModel& self) {
            return PySequence{self.lm, self.lm->new_sequence()};
          },
          "An empty Sequence of the model's context.")
      .def(
          "forward",
          [](const PyModel& self, PySequence& seq, const std::vector<std::int32_t>& ids, bool all_logits) {
            Sequence& s = sequence_of(self, seq, "forward");
            Tensor out;
            {
              nb::gil_scoped_release release;
              std::shared_lock lock(compute_mutex());
              out = self.lm->forward(s, ids, all_logits);
            }
            return export_tensor(std::move(out), Framework::numpy);
          },
          "seq"_a, "ids"_a, nb::kw_only(), "all_logits"_a = false,
          "Runs ids at the end of seq (appended to its cache): float32 logits [len(ids), V] with\n"
          "all_logits, else [1, V] of the last token.")
      .def(
          "decode",
          [](const PyModel& self, std::vector<PySequence*> seqs, const std::vector<std::int32_t>& ids) {
            return several(self, seqs, "decode",
                           [&](const std::vector<Sequence*>& raw) { return self.lm->decode(raw, ids); });
          },
          "seqs"_a, "ids"_a,
          "One decode step of several sequences in one pass (ids[i] at the end of seqs[i]): float32\n"
          "logits [len(seqs), V]. In the exact mode row i is what seqs[i] alone would give.")
      .def(
          "step",
          [](const PyModel& self, std::vector<PySequence*> seqs, const std::vector<std::vector<std::int32_t>>& ids) {
            return several(self, seqs, "step",
                           [&](const std::vector<Sequence*>& raw) { return self.lm->step(raw, ids); });
          },
          "seqs"_a, "ids"_a,
          "One pass over several sequences, each given its next tokens (one while it decodes, a chunk\n"
          "of its prompt while it is prefilled; ids[i] at the end of seqs[i]): float32 logits\n"
          "[len(seqs), V], row i for the last of ids[i]. In the exact mode row i is what\n"
          "forward(seqs[i], ids[i]) alone would give.")
      .def(
          "text_stream", [](const PyModel& self) { return PyTextStream{TextStream(self.lm->tokenizer())}; },
          "A TextStream over the model's tokenizer.")
      .def(
          "is_end_of_generation",
          [](const PyModel& self, std::int32_t id) {
            const std::shared_ptr<const Tokenizer> t = self.lm->tokenizer();
            return t != nullptr && t->is_end_of_generation(id);
          },
          "id"_a, "Whether the tokenizer's end-of-generation set holds id (False without a tokenizer).")
      .def_prop_ro(
          "chat_template",
          [](const PyModel& self) -> std::optional<std::string> {
            const std::shared_ptr<const Tokenizer> t = self.lm->tokenizer();
            if (!t || t->chat_template().empty()) return std::nullopt;
            return t->chat_template();
          },
          "The model's Jinja chat template as its file stores it, or None.")
      .def_prop_ro(
          "special_tokens",
          [](const PyModel& self) {
            nb::dict d;
            const std::shared_ptr<const Tokenizer> t = self.lm->tokenizer();
            const auto text = [&](std::int32_t id) -> nb::object {
              if (!t || id < 0) return nb::none();
              const std::string& s = t->token_text(id);
              return nb::str(s.data(), s.size());
            };
            d["bos_token"] = text(t ? t->bos() : -1);
            d["eos_token"] = text(t ? t->eos() : -1);
            d["bos_id"] = t ? t->bos() : -1;
            d["eos_id"] = t ? t->eos() : -1;
            return d;
          },
          "{'bos_token', 'eos_token' (their texts, or None), 'bos_id', 'eos_id' (-1: none)}")
      .def(
          "tokenize",
          [](const PyModel& self, const std::string& text, bool add_special, bool parse_special) {
            return tokenizer_of(self, "tokenize").encode(text, add_special, parse_special);
          },
          "text"_a, nb::kw_only(), "add_special"_a = true, "parse_special"_a = true,
          "Token ids of `text`: the file's own BOS rule (add_special) and its special tokens written in\n"
          "the text parsed (parse_special), as `moekit tokenize` prints them.")
      .def(
          "detokenize",
          [](const PyModel& self, const std::vector<std::int32_t>& ids) {
            tokenizer_of(self, "detokenize");
            return text_of(self.lm->tokenizer(), ids);
          },
          "ids"_a, "The text of `ids` (invalid UTF-8 bytes as U+FFFD).")
      .def(
          "token_bytes",
          [](const PyModel& self, std::int32_t id) {
            const std::string b = tokenizer_of(self, "token_bytes").token_bytes(id);
            return nb::bytes(b.data(), b.size());
          },
          "id"_a,
          "The bytes token `id` stands for (a byte-level token's bytes, SentencePiece's with its space;\n"
          "possibly part of a UTF-8 character), as the server's logprobs report them.");
}

}  // namespace moekit::py
