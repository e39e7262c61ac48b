#pragma once
// The run's data source (recipes/data): the built-in addition task, nanoGPT's
// train.bin/val.bin, or text. Text with a tokenizer (--tokenizer, or the
// --init-from directory's tokenizer.json) is tokenized once into a cache and
// memory-mapped (data/token_cache.h); without one a text file is read as bytes.
#include "strata/launch/environment.h"
#include "strata/recipes/config/cli.h"
#include "strata/recipes/data/instruct.h"
#include "strata/recipes/data/token_cache.h"
#include "strata/trainer/data_source.h"

#include <memory>
#include <optional>
#include <string>

namespace strata::recipes {

/// The tokenizer `config` uses for its data: --tokenizer, else --init-from's
/// directory when it holds a tokenizer.json and the data is text; "" for
/// none (--tokenizer none, addition, a token directory).
std::string run_tokenizer(const RunConfig& config);

/// The data of a run, planned before anything is written: its vocabulary and
/// block size (a tokenizer's loaded, nothing tokenized), then open()ed once
/// every check has passed.
class RunData {
 public:
  /// Reads what it must to know the shapes: the addition task, token
  /// files and a byte-level text as before; for tokenized text the tokenizer
  /// and that every source exists.
  static RunData plan(const RunConfig& config);
  int64_t vocab_size() const { return vocab_size_; }
  int64_t block_size() const { return block_size_; }
  /// The DataSource. Tokenized text is prepared by the process that starts
  /// the ranks (or, under an external launcher, each node's local rank 0);
  /// the other ranks wait for it, up to an hour.
  std::unique_ptr<DataSource> open(const std::optional<DistEnv>& env);

 private:
  std::unique_ptr<DataSource> ready_;
  std::optional<TokenCacheOptions> tokenized_;
  std::optional<InstructOptions> instruct_;
  int64_t vocab_size_ = 0, block_size_ = 0;
  uint64_t seed_ = 0;
};

}  // namespace strata::recipes
