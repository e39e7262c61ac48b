#include "strata/recipes/app/run_data.h"

#include "strata/recipes/data/data.h"
#include "strata/recipes/data/token_cache.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <c10/util/Exception.h>

#include <filesystem>

namespace strata::recipes {

namespace {

namespace fs = std::filesystem;

/// Text: neither the addition task nor a directory of nanoGPT token files.
bool is_text_data(const std::string& data) {
  std::error_code ec;
  return data != "addition" && data.rfind("addition:", 0) != 0 && !fs::exists(fs::path(data) / "train.bin", ec);
}

/// Other ranks wait this long for local rank 0's tokenization.
constexpr double kCacheWaitSeconds = 3600;

}  // namespace

std::string run_tokenizer(const RunConfig& c) {
  if (c.tokenizer == "none" || !is_text_data(c.data)) return "";
  if (!c.tokenizer.empty()) return c.tokenizer;
  if (!c.init_from.empty() && tokenizer_file(c.init_from)) return c.init_from;
  return "";
}

RunData RunData::plan(const RunConfig& c) {
  RunData data;
  data.seed_ = c.seed;
  const std::string tokenizer = run_tokenizer(c);
  if (tokenizer.empty()) {
    TORCH_CHECK_VALUE(c.val_data.empty(), "--val-data '", c.val_data, "' needs text data with a tokenizer (data '",
                      c.data, "', tokenizer '", c.tokenizer.empty() ? "none found" : c.tokenizer, "')");
    data.ready_ = make_data(c.data, c.block_size, c.vocab_size, c.seed);
    data.vocab_size_ = data.ready_->vocab_size();
    data.block_size_ = data.ready_->block_size();
    return data;
  }
  // --eval-only scores the whole of --data unless --val-data names the set.
  const std::string val = c.eval_only && c.val_data.empty() ? c.data : c.val_data;
  for (const std::string& source : {c.data, val}) {
    std::error_code ec;
    TORCH_CHECK_VALUE(source.empty() || fs::exists(source, ec), "data '", source, "' does not exist");
  }
  data.vocab_size_ = load_tokenizer(tokenizer)->vocab_size();
  data.block_size_ = c.block_size > 0 ? c.block_size : 256;
  if (is_instruct_data(c.data)) {
    // Instruction records: rendered and tokenized in memory when opened.
    if (c.prompt_style != "auto") make_prompt_style(c.prompt_style);  // an unknown name is bad input now
    data.instruct_ = InstructOptions{c.data, val, tokenizer, c.prompt_style, c.mask_prompt, data.block_size_, c.seed};
    return data;
  }
  TokenCacheOptions options;
  options.data = c.data;
  options.val_data = val;
  options.tokenizer = tokenizer;
  data.tokenized_ = options;
  return data;
}

std::unique_ptr<DataSource> RunData::open(const std::optional<DistEnv>& env) {
  if (instruct_) return make_instruct_data(*instruct_);
  if (!tokenized_) return std::move(ready_);
  // Why wait: ranks of one node share the data's directory; one of them
  // tokenizes, the others read what it wrote (each node's own, so a node
  // without a shared filesystem still gets a cache).
  const TokenCache cache = env && env->local_rank != 0 ? wait_for_token_cache(*tokenized_, kCacheWaitSeconds)
                                                       : prepare_token_cache(*tokenized_);
  return open_tokenized_data(cache, block_size_, seed_);
}

}  // namespace strata::recipes
