// libFuzzer target: untrusted input into the tokenizers (moekit/tokenizer.hpp). The first byte picks
// what the rest is:
//  - text (any bytes) encoded by small checked-in tokenizers of both kinds (tests/goldens/tokenizer:
//    Qwen3-style byte-level BPE and Mixtral-style SentencePiece BPE, from their GGUFs and folders),
//    with and without special tokens;
//  - token ids (little-endian int32) decoded, token by token and through a TextStream;
//  - a GGUF image read as a tokenizer, which then encodes and decodes a fixed text.
// Any input must give ids / text or throw a std::exception; a crash, a sanitizer report, a leak or
// another exception type is a bug. scripts/fuzz.sh runs it; MOEKIT_FUZZ_WRITE_TOKENIZER_SEEDS
// (a folder) makes it write seeds of each kind first.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "moekit/gguf.hpp"
#include "moekit/tokenizer.hpp"

namespace {

std::vector<std::shared_ptr<const moekit::Tokenizer>>& tokenizers() {
  static std::vector<std::shared_ptr<const moekit::Tokenizer>> all;
  return all;
}

void exercise(const moekit::Tokenizer& tok, const std::string& text, bool special) {
  try {
    const std::vector<std::int32_t> ids = tok.encode(text, special, special);
    const std::string back = tok.decode(ids, !special);
    moekit::TextStream stream(std::shared_ptr<const moekit::Tokenizer>(&tok, [](const moekit::Tokenizer*) {}));
    std::string streamed;
    for (const std::int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    (void)back;
  } catch (const std::exception&) {
  }
}

void write_seed(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const std::string dir = MOEKIT_FUZZ_TOKENIZER_DIR;
  for (const char* style : {"qwen3", "mixtral"}) {
    tokenizers().push_back(moekit::Tokenizer::from_gguf(*moekit::GgufFile::open(dir + "/" + style + "/vocab.gguf")));
    tokenizers().push_back(moekit::Tokenizer::from_folder(dir + "/" + style));
  }
  if (const char* seeds = std::getenv("MOEKIT_FUZZ_WRITE_TOKENIZER_SEEDS")) {
    write_seed(seeds, "text.bin",
               std::string(1, '\0') + "<|im_start|>user\nHello, world! 你好 🦙\n<|im_end|>\n  x\t\r\n1234 don't");
    std::string ids(1, '\1');
    for (const std::int32_t id : {0, 1, 2, 300, 3000, 3259, 3268}) ids.append(reinterpret_cast<const char*>(&id), 4);
    write_seed(seeds, "ids.bin", ids);
    std::ifstream in(dir + "/qwen3/vocab.gguf", std::ios::binary);
    write_seed(seeds, "vocab.bin", std::string(1, '\2') + std::string(std::istreambuf_iterator<char>(in), {}));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0] % 3;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 0) {
    for (const auto& tok : tokenizers())
      for (const bool special : {true, false}) exercise(*tok, rest, special);
  } else if (mode == 1) {
    std::vector<std::int32_t> ids(rest.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), rest.data(), ids.size() * 4);
    for (const auto& tok : tokenizers()) {
      try {
        (void)tok->decode(ids, (data[0] & 4) != 0);
      } catch (const std::exception&) {
      }
      moekit::TextStream stream(tok);
      std::string out;
      for (const std::int32_t id : ids) {
        try {
          out += stream.push(id);
        } catch (const std::exception&) {
        }
      }
      out += stream.flush();
    }
  } else {
    try {
      const auto file = moekit::GgufFile::from_bytes(std::vector<std::uint8_t>(rest.begin(), rest.end()), "fuzz.gguf");
      const auto tok = moekit::Tokenizer::from_gguf(*file);
      exercise(*tok, "Hello, world! <|im_end|> 你好 🦙 \n\n  x", true);
      (void)tok->describe();
    } catch (const std::exception&) {
    }
  }
  return 0;
}
