// instruct_test - instruction records, prompt styles and the masked loss
// (recipes/data/instruct.h, prompt_style.h), with real tokenizers
// (tests/fixtures/tokenizers).
#include "tests/error_text.h"
#include "tests/temp_dir.h"
#include "strata/recipes/data/instruct.h"
#include "strata/recipes/data/token_cache.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"
#include "strata/recipes/models/lm.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace {

namespace fs = std::filesystem;
using namespace strata::recipes;
using strata::testing::what_of;
using strata::Batch;

const fs::path kFixtures = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "tokenizers";

/// 20 Alpaca-style records (some with an input), as a .json list.
fs::path alpaca_file(const fs::path& dir) {
  const fs::path path = dir / "alpaca.json";
  std::ofstream out(path);
  out << "[";
  for (int i = 0; i < 20; ++i) {
    out << (i ? "," : "") << "{\"instruction\": \"Add " << i << " and " << i + 1 << ".\", \"input\": \""
        << (i % 3 == 0 ? "in words" : "") << "\", \"output\": \"" << 2 * i + 1 << "\"}";
  }
  out << "]";
  return path;
}

TEST(InstructTest, PromptPositionsAreMaskedAndTheLossIsTheAnswersAlone) {
  strata::testing::TempDir dir;
  InstructOptions o;
  o.data = alpaca_file(dir.path()).string();
  o.tokenizer = (kFixtures / "tinyllama").string();
  o.block_size = 96;
  o.seed = 3;
  const auto data = make_instruct_data(o);
  EXPECT_NE(data->name().find("prompt style zephyr"), std::string::npos) << data->name() << ": TinyLlama's template";
  const Batch batch = data->train_batch(0, 4, {0, 1});
  const auto tok = load_tokenizer(o.tokenizer);
  for (int64_t row = 0; row < 4; ++row) {
    // The targets that train decode to the answer and its end marker: "<digits></s>".
    std::vector<int32_t> trained;
    for (int64_t t = 0; t < o.block_size; ++t) {
      if (const int64_t id = batch.target[row][t].item<int64_t>(); id >= 0) trained.push_back(int32_t(id));
    }
    const std::string answer = tok->decode(trained);
    ASSERT_FALSE(trained.empty());
    EXPECT_EQ(answer.substr(answer.size() - 4), "</s>") << answer;
    EXPECT_LE(trained.size(), 6u) << "only the answer trains: " << answer;
  }
  // The loss over the batch equals one computed by hand over the trained positions alone.
  torch::manual_seed(0);
  const auto logits = torch::randn({4, o.block_size, data->vocab_size()});
  const auto loss = lm_loss(logits, batch.target);
  const auto logp = torch::log_softmax(logits, -1);
  double sum = 0.0;
  int64_t count = 0;
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t t = 0; t < o.block_size; ++t) {
      const int64_t id = batch.target[row][t].item<int64_t>();
      if (id < 0) continue;
      sum -= logp[row][t][id].item<double>();
      ++count;
    }
  }
  EXPECT_NEAR(loss.item<double>(), sum / double(count), 1e-5);
  // Without the mask every next token trains (padding still does not).
  o.mask_prompt = false;
  const Batch all = make_instruct_data(o)->train_batch(0, 4, {0, 1});
  EXPECT_GT((all.target >= 0).sum().item<int64_t>(), 4 * (batch.target >= 0).sum().item<int64_t>() / 4 + 20);
}

TEST(InstructTest, BadRecordsNameTheFileRecordAndKey) {
  strata::testing::TempDir dir;
  const fs::path jsonl = dir.path() / "sft.jsonl";
  std::ofstream(jsonl) << "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"no output\"}\n";
  EXPECT_EQ(what_of([&] { read_instruct_records(jsonl.string()); }),
            c10::str("'", jsonl.string(), "' line 2: expected \"output\" (a string), as Alpaca's records have, or ",
                     "\"messages\""));
  std::ofstream(jsonl) << "{\"instruction\": \"a\", \"output\": \"b\"}\nnot json\n";
  EXPECT_NE(what_of([&] { read_instruct_records(jsonl.string()); }).find("line 2 is not JSON"), std::string::npos);
  const fs::path json = dir.path() / "chat.json";
  std::ofstream(json) << "[{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}]";
  EXPECT_NE(what_of([&] { read_instruct_records(json.string()); }).find("record 1: the last message is the answer"),
            std::string::npos);
  EXPECT_NE(what_of([&] { make_prompt_style("vicuna"); }).find("unknown prompt style 'vicuna'; allowed: alpaca"),
            std::string::npos);
  EXPECT_TRUE(is_instruct_data(json.string()));
  std::ofstream(jsonl) << "{\"text\": \"pretraining\"}\n";
  EXPECT_FALSE(is_instruct_data(jsonl.string())) << "a text record is pretraining data";
}

}  // namespace
