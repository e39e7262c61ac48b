#pragma once
// The data people bring, tokenized once: text files, a directory of them, or
// JSONL records with a "text" field, through a real tokenizer
// (data/tokenizer/tokenizer.h), into token files that training memory-maps.
//
// - A directory's .txt, .md, .text and .jsonl files are read, by path.
// - Each file (a JSONL file: each record) is a document; the tokenizer's EOS
//   follows every document.
// - Tokenized on every core (documents in parallel), with progress on stderr.
// - The cache lives beside the data (<data>.strata-tokens/<key>/, else under
//   $XDG_CACHE_HOME/strata/tokens/), keyed by a hash of the tokenizer file and
//   of every source file's path, size and CRC-32, so a changed file or
//   tokenizer tokenizes again and an unchanged one never does.
// - Tokens are uint16 where the vocabulary fits, else uint32.
// - A process writes only its own temporary directory and renames it into
//   place: two processes preparing at once both finish, one rename wins, no
//   file is written by two.
// - Held out: a separate --val-data source, or the last 10% of the tokens
//   (at least one window).
#include "strata/recipes/data/data.h"

#include <cstdint>
#include <memory>
#include <string>

namespace strata::recipes {

struct TokenCacheOptions {
  std::string data;       ///< a text or JSONL file, or a directory of them
  std::string val_data;   ///< the same for the held-out set ("": the last 10% of data's)
  std::string tokenizer;  ///< a tokenizer.json, or a directory holding one
  int threads = 0;        ///< 0: every core
  bool progress = true;   ///< a progress line on stderr while tokenizing
};

/// A prepared cache, as its meta.json says.
struct TokenCache {
  std::string dir;
  std::string dtype;  ///< "uint16" or "uint32"
  int64_t vocab_size = 0;
  int32_t eos_id = 0;  ///< -1: the tokenizer has none (documents joined as they are)
  int64_t documents = 0, tokens = 0;
  int64_t val_documents = 0, val_tokens = 0;  ///< 0: no val.bin
  bool prepared_now = false;                  ///< this call tokenized (else it was there)
};

class Tokenizer;
/// The EOS token's id: tokenizer_config.json's eos_token beside the tokenizer
/// at `tokenizer_path`, else the first of <|end_of_text|>, <|endoftext|>,
/// </s>, <|im_end|>, <eos> that it has; -1 for none.
int32_t tokenizer_eos_id(const Tokenizer& tok, const std::string& tokenizer_path);

/// The cache for `options`, tokenizing first if it is not there. Bad input
/// (a missing file, text that is not UTF-8, a JSONL line that is not JSON or
/// has no "text" string): c10::ValueError,
/// one line naming the file, the line or byte, and what was expected; no
/// cache is left behind.
TokenCache prepare_token_cache(const TokenCacheOptions& options);

/// The same cache, waiting up to `timeout_s` for another process (local rank
/// 0) to prepare it; c10::Error naming the directory when it does not appear.
TokenCache wait_for_token_cache(const TokenCacheOptions& options, double timeout_s);

/// Training windows over the memory-mapped cache (train: all.bin, or its
/// first 90%; held out: val.bin, or the last 10%).
std::unique_ptr<DataSource> open_tokenized_data(const TokenCache& cache, int64_t block_size, uint64_t seed);

}  // namespace strata::recipes
