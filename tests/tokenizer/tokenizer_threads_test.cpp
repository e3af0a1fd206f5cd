// One tokenizer shared by several threads (the server's workers share the model's): each thread's
// ids are the tokenizers library's. In a file of its own because it is the tokenizer test the
// ThreadSanitizer build compiles (tests/CMakeLists.txt: that build leaves out the tests of code
// that runs on one thread).
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "moekit/gguf.hpp"
#include "moekit/tokenizer.hpp"
#include "tokenizer/unicode.hpp"
#include "util/files.hpp"

namespace moekit {
namespace {

using json = nlohmann::json;
const std::string kDir = std::string(MOEKIT_TEST_DATA_DIR) + "/tokenizer/";

using testing::load_json;

TEST(TokenizerThreads, OneTokenizerEncodesAndDecodesOnSeveralThreadsAtOnce) {
  const json ref = load_json(kDir + "qwen3/reference.json");
  const auto texts = ref["texts"].get<std::vector<std::string>>();
  const auto want = ref["special"].get<std::vector<std::vector<std::int32_t>>>();
  for (const auto& tok :
       {Tokenizer::from_folder(kDir + "qwen3"), Tokenizer::from_gguf(*GgufFile::open(kDir + "qwen3/vocab.gguf"))}) {
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&] {
        for (std::size_t i = 0; i < texts.size(); ++i) {
          // A text whose NFC form differs is left out: the GGUF's tokenizer does not normalize.
          const bool nfc = tok::normalize(texts[i], tok::NormalForm::nfc) == texts[i];
          if (nfc && tok->encode(texts[i]) != want[i]) ++wrong;
          (void)tok->decode(want[i]);
        }
      });
    for (std::thread& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
  }
}

}  // namespace
}  // namespace moekit
