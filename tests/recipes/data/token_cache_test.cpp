// token_cache_test - text and JSONL data tokenized once into a cache beside
// it (recipes/data/token_cache.h), with a real tokenizer (tests/fixtures/tokenizers).
#include "tests/error_text.h"
#include "tests/temp_dir.h"
#include "strata/recipes/data/token_cache.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

namespace {

namespace fs = std::filesystem;
using namespace strata::recipes;
using strata::testing::what_of;

const fs::path kFixtures = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "tokenizers";

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

template <typename Token>
std::vector<int32_t> read_tokens(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<Token> raw((fs::file_size(path)) / sizeof(Token));
  in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size() * sizeof(Token)));
  return {raw.begin(), raw.end()};
}

/// Four files, five documents: the order they are read in (by path).
struct Corpus {
  strata::testing::TempDir dir;
  std::vector<std::string> documents = {"First file.\nIts second line.", "# Markdown\n\nwith 中文 and 👍🏽",
                                        "record one", "record two <|endoftext|> inside", "Last, in a subdirectory."};
  Corpus() {
    write(dir.path() / "data" / "a.txt", documents[0]);
    write(dir.path() / "data" / "b.md", documents[1]);
    write(dir.path() / "data" / "r.jsonl", "{\"text\": \"record one\"}\n\n{\"text\": \"record two <|endoftext|> inside\"}\n");
    write(dir.path() / "data" / "sub" / "c.txt", documents[4]);
  }
  TokenCacheOptions options(const std::string& tokenizer) const {
    TokenCacheOptions o;
    o.data = (dir.path() / "data").string();
    o.tokenizer = (kFixtures / tokenizer).string();
    o.progress = false;
    return o;
  }
  /// What the cache must hold: each document's ids, then EOS.
  std::vector<int32_t> expected(const Tokenizer& tok, int32_t eos) const {
    std::vector<int32_t> all;
    for (const auto& d : documents) {
      const auto ids = tok.encode(d);
      all.insert(all.end(), ids.begin(), ids.end());
      all.push_back(eos);
    }
    return all;
  }
};

TEST(TokenCacheTest, EachDocumentsIdsThenEosOnceAndAgainOnlyWhenAFileChanges) {
  Corpus corpus;
  const TokenCache cache = prepare_token_cache(corpus.options("gpt2"));
  EXPECT_TRUE(cache.prepared_now);
  EXPECT_EQ(cache.dtype, "uint16") << "GPT-2's 50257 ids fit";
  EXPECT_EQ(cache.vocab_size, 50257);
  EXPECT_EQ(cache.eos_id, 50256);
  EXPECT_EQ(cache.documents, 5);
  EXPECT_EQ(fs::path(cache.dir).parent_path(), corpus.dir.path() / "data.strata-tokens") << "beside the data";
  const auto tok = load_tokenizer((kFixtures / "gpt2").string());
  const auto stored = read_tokens<uint16_t>(fs::path(cache.dir) / "all.bin");
  EXPECT_EQ(stored, corpus.expected(*tok, 50256));
  EXPECT_EQ(int64_t(stored.size()), cache.tokens);
  // Again: the same cache, not tokenized again.
  const TokenCache again = prepare_token_cache(corpus.options("gpt2"));
  EXPECT_FALSE(again.prepared_now);
  EXPECT_EQ(again.dir, cache.dir);
  // One file changed (same size): another key.
  write(corpus.dir.path() / "data" / "a.txt", "First file.\nIts second LINE.");
  const TokenCache changed = prepare_token_cache(corpus.options("gpt2"));
  EXPECT_TRUE(changed.prepared_now);
  EXPECT_NE(changed.dir, cache.dir);
  // Another tokenizer: another key; a vocabulary above 65536 stores uint32.
  const TokenCache llama = prepare_token_cache(corpus.options("llama3"));
  EXPECT_EQ(llama.dtype, "uint32");
  EXPECT_NE(llama.dir, changed.dir);
  corpus.documents[0] = "First file.\nIts second LINE.";
  const auto llama_tok = load_tokenizer((kFixtures / "llama3").string());
  EXPECT_EQ(read_tokens<uint32_t>(fs::path(llama.dir) / "all.bin"), corpus.expected(*llama_tok, llama.eos_id));
  for (const auto& entry : fs::directory_iterator(corpus.dir.path() / "data.strata-tokens")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos) << "no temporary left";
  }
}

TEST(TokenCacheTest, TwoPreparersAtOnceBothGetTheOneCache) {
  Corpus corpus;
  TokenCache a, b;
  std::thread other([&] { a = prepare_token_cache(corpus.options("gpt2")); });
  b = prepare_token_cache(corpus.options("gpt2"));
  other.join();
  EXPECT_EQ(a.dir, b.dir);
  EXPECT_EQ(a.tokens, b.tokens);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(corpus.dir.path() / "data.strata-tokens")) ++entries;
  EXPECT_EQ(entries, 1u) << "one cache, no temporary left";
  EXPECT_EQ(wait_for_token_cache(corpus.options("gpt2"), 1.0).dir, a.dir);
}

TEST(TokenCacheTest, WindowsReadTheStreamAndHoldOutItsEnd) {
  Corpus corpus;
  const TokenCache cache = prepare_token_cache(corpus.options("gpt2"));
  const auto stream = read_tokens<uint16_t>(fs::path(cache.dir) / "all.bin");
  const auto data = open_tokenized_data(cache, 4, 7);
  EXPECT_EQ(data->vocab_size(), 50257);
  const auto batch = data->train_batch(0, 3, {0, 1});
  const int64_t held = std::max<int64_t>(cache.tokens / 10, 5);
  for (int64_t row = 0; row < 3; ++row) {
    const auto in = batch.input[row], tgt = batch.target[row];
    // A window of the training part: some offset where the stream matches, shifted by one in the target.
    bool found = false;
    for (int64_t off = 0; off + 5 <= cache.tokens - held && !found; ++off) {
      bool match = true;
      for (int64_t t = 0; t < 4 && match; ++t) {
        match = in[t].item<int64_t>() == stream[size_t(off + t)] && tgt[t].item<int64_t>() == stream[size_t(off + t + 1)];
      }
      found = match;
    }
    EXPECT_TRUE(found) << "row " << row;
  }
  const auto val = data->val_batch(0, 1, {0, 1});
  EXPECT_EQ(val.input[0][0].item<int64_t>(), stream[size_t(cache.tokens - held)]) << "held out: the last 10%";
  EXPECT_NE(what_of([&] { open_tokenized_data(cache, cache.tokens, 7); }).find("is larger than the data"),
            std::string::npos);
}

TEST(TokenCacheTest, BadRecordsNameTheFileAndLineAndLeaveNoCache) {
  strata::testing::TempDir dir;
  TokenCacheOptions o;
  o.tokenizer = (kFixtures / "gpt2").string();
  o.progress = false;
  o.data = (dir.path() / "bad.jsonl").string();
  write(o.data, "{\"text\": \"fine\"}\nnot json\n");
  EXPECT_NE(what_of([&] { prepare_token_cache(o); }).find("bad.jsonl' line 2 is not JSON"), std::string::npos);
  write(o.data, "{\"text\": \"fine\"}\n{\"instruction\": \"no text\"}\n");
  EXPECT_NE(what_of([&] { prepare_token_cache(o); }).find("bad.jsonl' line 2: expected an object with a \"text\" string"),
            std::string::npos);
  o.data = (dir.path() / "bytes.txt").string();
  write(o.data, "ok \xff not UTF-8");
  EXPECT_NE(what_of([&] { prepare_token_cache(o); }).find("bytes.txt': text is not UTF-8: byte 3"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.path() / "bad.jsonl.strata-tokens")) << "nothing left behind";
  EXPECT_FALSE(fs::exists(dir.path() / "bytes.txt.strata-tokens"));
  o.data = (dir.path() / "missing.txt").string();
  EXPECT_EQ(what_of([&] { prepare_token_cache(o); }), "data '" + o.data + "' does not exist");
}

}  // namespace
