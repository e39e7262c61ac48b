#pragma once
// A tiktoken BPE file, such as Llama 3's original `tokenizer.model`: one
// "<base64 bytes> <rank>" line per token, ranks 0..n-1. The file holds no
// pre-tokenizer and no special tokens: as Meta's llama3/tokenizer.py (and
// transformers' TikTokenConverter) pair them with it, strata reads it with
// Llama 3's split regex and its 256 special tokens after the ranks, and runs
// it as the tokenizer.json transformers would convert it to: byte-level BPE
// whose merges are every split of a token into two tokens, ranked by the
// token (so each merge step takes the lowest-ranked adjacent pair, as
// tiktoken does), and a word found whole in the ranks taken whole
// (ignore_merges, as tiktoken does). tokenizer_test.cpp compares the ids
// with the PyPI tiktoken library's.
#include <nlohmann/json.hpp>

#include <string>

namespace strata::recipes::tokenizer {

/// Whether `head` (a file's first bytes) starts like a tiktoken file.
bool looks_like_tiktoken(const std::string& head);

/// The tokenizer.json equivalent of the tiktoken file at `file`; c10::ValueError
/// naming the line and what was expected for a malformed one.
nlohmann::json tiktoken_as_tokenizer_json(const std::string& file);

}  // namespace strata::recipes::tokenizer
