// The models: BPE over a pre-tokenized word, and llama.cpp's SentencePiece merging (tokenizer_impl.hpp).
//
// BPE (the tokenizers library's bpe/word.rs, llama.cpp's llm_tokenizer_bpe_session): a word starts
// as one symbol per character; the adjacent pair with the lowest merge rank is merged (ties: the
// leftmost pair), until no adjacent pair has a merge.
//
// SentencePiece BPE (llama.cpp's llm_tokenizer_spm_session): the whole normalized text starts as
// one symbol per character; the adjacent pair whose concatenation is a token with the highest score
// is merged (ties: the leftmost), until no adjacent pair is a token; a symbol left without a token
// becomes its bytes' <0xXX> tokens.
#include <algorithm>
#include <queue>
#include <stdexcept>

#include "tokenizer/tokenizer_impl.hpp"
#include "util/error.hpp"

namespace moekit::tok {

namespace {

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
}

// One symbol of a word being merged: its bytes [begin, begin + len) of the word (len 0: merged
// into its left neighbour), its id, and its neighbours.
struct Symbol {
  std::int32_t id;
  std::uint32_t begin, len;
  std::int32_t prev, next;
};

}  // namespace

bool parse_byte_token(std::string_view text, std::uint8_t& b) noexcept {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return false;
  int v = 0;
  for (std::size_t i = 3; i < 5; ++i) {
    const char c = text[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return false;
    v = v * 16 + d;
  }
  b = static_cast<std::uint8_t>(v);
  return true;
}

std::int32_t Model::lookup(std::string_view text) const noexcept {
  const auto it = vocab.find(text);
  return it == vocab.end() ? -1 : it->second;
}

void Model::add_merge(std::string_view left, std::string_view right, std::int32_t rank, bool strict,
                      const std::string& source, const char* key) {
  std::int32_t ids[3];
  const std::string merged = std::string(left) + std::string(right);
  const std::string_view parts[3] = {left, right, merged};
  for (int i = 0; i < 3; ++i) {
    ids[i] = lookup(parts[i]);
    if (ids[i] >= 0) continue;
    if (strict)
      fail(source, MOEKIT_MSG(key << "[" << rank << "] ('" << left << "' + '" << right << "'): '" << parts[i]
                                  << "' is not in the vocabulary"));
    // llama.cpp merges by text: a piece no token spells still merges, and falls back to bytes at the end.
    ids[i] = n_vocab + static_cast<std::int32_t>(interned.size());
    interned.emplace_back(parts[i]);
    vocab.emplace(interned.back(), ids[i]);
  }
  merges.emplace(pair_key(ids[0], ids[1]), Merge{rank, ids[2]});  // a repeated pair keeps its first rank
}

void Model::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (kind == Kind::spm)
    encode_spm(word, out);
  else
    encode_bpe(word, out);
}

void Model::push_bytes(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (kind == Kind::bpe) {
    // llama.cpp (byte-level): each byte of the piece as a one-byte token, where there is one.
    for (const char c : piece) {
      const std::int32_t id = lookup(std::string_view(&c, 1));
      if (id >= 0 && id < n_vocab) out.push_back(id);
    }
    return;
  }
  // llama.cpp's byte_to_token: <0xXX>, else the byte itself as a token; moekit then takes unk,
  // where llama.cpp fails.
  static const char* hex = "0123456789ABCDEF";
  for (const char c : piece) {
    const auto b = static_cast<unsigned char>(c);
    const char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
    std::int32_t id = lookup(std::string_view(name, 6));
    if (id < 0) id = lookup(std::string_view(&c, 1));
    if (id < 0) id = unk;
    if (id < 0)
      throw std::invalid_argument(MOEKIT_MSG("[moekit::Tokenizer::encode] byte 0x"
                                             << hex[b >> 4] << hex[b & 15] << " has no token (no <0x" << hex[b >> 4]
                                             << hex[b & 15] << ">, no unknown token)"));
    out.push_back(id);
  }
}

void Model::encode_bpe(std::string_view word, std::vector<std::int32_t>& out) const {
  if (ignore_merges) {
    const std::int32_t id = lookup(word);
    if (id >= 0 && id < n_vocab) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  const auto add = [&](std::int32_t id, std::size_t begin, std::size_t len) {
    syms.push_back({id, static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(len), 0, 0});
  };
  // The tokenizers library's merge_word: a character outside the vocabulary is its bytes'
  // <0xXX> tokens (byte_fallback), else the unknown token (consecutive ones fused with fuse_unk),
  // else nothing. llama.cpp keeps it as a symbol without a token (id -1).
  bool unk_pending = false;
  std::size_t unk_begin = 0, unk_len = 0;
  const auto flush_unk = [&] {
    if (unk_pending) add(unk, unk_begin, unk_len);
    unk_pending = false;
  };
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t l = std::min(utf8_char_len(static_cast<unsigned char>(word[i])), word.size() - i);
    const std::int32_t id = lookup(word.substr(i, l));
    if (id >= 0) {
      flush_unk();
      add(id, i, l);
    } else if (llama_fallback) {
      add(-1, i, l);
    } else {
      bool done = false;
      if (byte_fallback) {
        std::int32_t bytes[4];
        done = true;
        for (std::size_t k = 0; k < l && done; ++k) {
          static const char* hex = "0123456789ABCDEF";
          const auto b = static_cast<unsigned char>(word[i + k]);
          const char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
          bytes[k] = lookup(std::string_view(name, 6));
          done = bytes[k] >= 0;
        }
        if (done)  // (the library does not flush a pending unk first: the same order here)
          for (std::size_t k = 0; k < l; ++k) add(bytes[k], i + k, 1);
      }
      if (!done && unk >= 0) {
        if (unk_pending && fuse_unk) {
          unk_len += l;
        } else {
          flush_unk();
          unk_pending = true;
          unk_begin = i;
          unk_len = l;
        }
      }
    }
    i += l;
  }
  flush_unk();
  if (syms.empty()) return;
  const auto n = static_cast<std::int32_t>(syms.size());
  for (std::int32_t i = 0; i < n; ++i) {
    syms[static_cast<std::size_t>(i)].prev = i - 1;
    syms[static_cast<std::size_t>(i)].next = i + 1 < n ? i + 1 : -1;
  }

  struct Candidate {
    std::int32_t rank, pos, result;
    bool operator<(const Candidate& o) const {  // the lowest rank, then the leftmost, on top
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  const auto consider = [&](std::int32_t left) {
    if (left < 0) return;
    const Symbol& a = syms[static_cast<std::size_t>(left)];
    if (a.next < 0 || a.id < 0) return;
    const Symbol& b = syms[static_cast<std::size_t>(a.next)];
    if (b.id < 0) return;
    const auto it = merges.find(pair_key(a.id, b.id));
    if (it != merges.end()) queue.push({it->second.rank, left, it->second.result});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& a = syms[static_cast<std::size_t>(c.pos)];
    if (a.len == 0 || a.next < 0) continue;  // merged away meanwhile
    Symbol& b = syms[static_cast<std::size_t>(a.next)];
    const auto it = merges.find(pair_key(a.id, b.id));
    if (it == merges.end() || it->second.result != c.result) continue;  // a stale candidate
    a.id = c.result;
    a.len += b.len;
    a.next = b.next;
    b.len = 0;
    if (a.next >= 0) syms[static_cast<std::size_t>(a.next)].prev = c.pos;
    consider(a.prev);
    consider(c.pos);
  }
  for (std::int32_t i = 0; i >= 0; i = syms[static_cast<std::size_t>(i)].next) {
    const Symbol& s = syms[static_cast<std::size_t>(i)];
    if (s.id >= 0 && s.id < n_vocab)
      out.push_back(s.id);
    else
      push_bytes(word.substr(s.begin, s.len), out);
  }
}

void Model::encode_spm(std::string_view text, std::vector<std::int32_t>& out) const {
  std::vector<Symbol> syms;
  syms.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t l = std::min(utf8_char_len(static_cast<unsigned char>(text[i])), text.size() - i);
    const auto idx = static_cast<std::int32_t>(syms.size());
    syms.push_back({-1, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(l), idx - 1, -1});
    if (idx > 0) syms[static_cast<std::size_t>(idx - 1)].next = idx;
    i += l;
  }
  if (syms.empty()) return;

  struct Bigram {
    float score;
    std::int32_t left, right;
    std::uint32_t size;
    bool operator<(const Bigram& o) const {  // the highest score, then the leftmost, on top
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Bigram> queue;
  const auto consider = [&](std::int32_t left, std::int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = syms[static_cast<std::size_t>(left)];
    const Symbol& b = syms[static_cast<std::size_t>(right)];
    const std::int32_t id = lookup(text.substr(a.begin, a.len + b.len));
    if (id < 0 || id >= n_vocab) return;
    queue.push({scores[static_cast<std::size_t>(id)], left, right, a.len + b.len});
  };
  for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(syms.size()); ++i) consider(i, i + 1);
  while (!queue.empty()) {
    const Bigram g = queue.top();
    queue.pop();
    Symbol& a = syms[static_cast<std::size_t>(g.left)];
    Symbol& b = syms[static_cast<std::size_t>(g.right)];
    if (a.len == 0 || b.len == 0 || a.len + b.len != g.size) continue;  // one side merged meanwhile
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) syms[static_cast<std::size_t>(b.next)].prev = g.left;
    consider(a.prev, g.left);
    consider(g.left, a.next);
  }
  for (std::int32_t i = 0; i >= 0; i = syms[static_cast<std::size_t>(i)].next) {
    const Symbol& s = syms[static_cast<std::size_t>(i)];
    const std::int32_t id = lookup(text.substr(s.begin, s.len));
    if (id >= 0 && id < n_vocab)
      out.push_back(id);
    else
      push_bytes(text.substr(s.begin, s.len), out);
  }
}

}  // namespace moekit::tok
