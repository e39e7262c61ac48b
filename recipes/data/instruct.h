#pragma once
// Instruction fine-tuning data: Alpaca-style records (instruction, input,
// output) or chat records (messages with role and content), in a .json file
// (an array) or .jsonl (one record per line), rendered by a prompt style
// (data/prompt_style.h) and tokenized in memory on every core.
//
// Each record is one sample of up to block_size + 1 tokens: the prompt's
// targets are -1 (no loss) unless mask_prompt is false; a shorter sample is
// padded with the tokenizer's EOS as input and -1 as target, so padding costs
// no loss. Samples are not packed together: without a block-diagonal
// attention mask a packed sample would attend to the one before it, which is
// not the same training. A record whose prompt alone fills the block has
// nothing to train and is dropped (counted in name()).
#include "strata/recipes/data/prompt_style.h"
#include "strata/trainer/data_source.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::recipes {

class Tokenizer;

struct InstructOptions {
  std::string data;                   ///< .json or .jsonl
  std::string val_data;               ///< the same, held out ("": every 20th record by a seeded hash)
  std::string tokenizer;              ///< a tokenizer.json, or a directory holding one
  std::string prompt_style = "auto";  ///< auto: the tokenizer's (prompt_style_for)
  bool mask_prompt = true;
  int64_t block_size = 256;
  uint64_t seed = 0;
};

/// Whether `path` is instruction data: a .json file, or a .jsonl file whose
/// first record has "instruction" or "messages".
bool is_instruct_data(const std::string& path);

/// The records of a .json or .jsonl file. A line or record that is not a JSON
/// object, or has neither "messages" (a list of {role, content} strings) nor
/// "instruction" and "output" strings: c10::ValueError naming the file, the
/// record (or line) and the key.
std::vector<InstructRecord> read_instruct_records(const std::string& path);

/// One sample's ids and which targets train.
struct InstructSample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  ///< per id: whether it is a trained target
};

/// `record` under `style` as ids (truncated to `max_tokens`).
InstructSample tokenize_record(const InstructRecord& record, const PromptStyle& style, const Tokenizer& tok,
                               int32_t eos, size_t max_tokens);

std::unique_ptr<DataSource> make_instruct_data(const InstructOptions& options);

}  // namespace strata::recipes
