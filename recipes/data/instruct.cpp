#include "strata/recipes/data/instruct.h"

#include "strata/recipes/data/data.h"
#include "strata/recipes/data/token_cache.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

namespace strata::recipes {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint64_t kInstructTrain = 0x696e737472000001ULL;  // "instr"
constexpr uint64_t kInstructSplit = 0x696e737472000002ULL;

/// One record from its JSON object; `where` names it in errors.
InstructRecord record_of(const json& j, const std::string& where) {
  TORCH_CHECK_VALUE(j.is_object(), where, ": expected a JSON object, got ", j.dump().substr(0, 60));
  InstructRecord r;
  if (j.contains("messages")) {
    TORCH_CHECK_VALUE(j["messages"].is_array() && !j["messages"].empty(), where, ": \"messages\" must be a non-empty list");
    for (const auto& m : j["messages"]) {
      TORCH_CHECK_VALUE(m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content") &&
                            m["content"].is_string(),
                        where, ": each message needs \"role\" and \"content\" strings, got ", m.dump().substr(0, 60));
      r.messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    TORCH_CHECK_VALUE(r.messages.back().role == "assistant", where,
                      ": the last message is the answer to train, so its role must be assistant, got '",
                      r.messages.back().role, "'");
    return r;
  }
  for (const char* key : {"instruction", "output"}) {
    TORCH_CHECK_VALUE(j.contains(key) && j[key].is_string(), where, ": expected \"", key,
                      "\" (a string), as Alpaca's records have, or \"messages\"");
  }
  r.instruction = j["instruction"].get<std::string>();
  r.output = j["output"].get<std::string>();
  if (j.contains("input") && !j["input"].is_null()) {
    TORCH_CHECK_VALUE(j["input"].is_string(), where, ": \"input\" must be a string");
    r.input = j["input"].get<std::string>();
  }
  return r;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "data '", path, "' cannot be read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Tokenized samples of `records` (in order), on every core.
std::vector<InstructSample> tokenize_all(const std::vector<InstructRecord>& records, const PromptStyle& style,
                                         const Tokenizer& tok, int32_t eos, size_t max_tokens) {
  std::vector<InstructSample> out(records.size());
  std::vector<std::string> errors(records.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < records.size();) {
      try {
        out[i] = tokenize_record(records[i], style, tok, eos, max_tokens);
      } catch (const c10::Error& e) {
        errors[i] = e.what_without_backtrace();
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::max(1u, std::thread::hardware_concurrency()); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  for (size_t i = 0; i < records.size(); ++i) TORCH_CHECK_VALUE(errors[i].empty(), "record ", i + 1, ": ", errors[i]);
  return out;
}

class InstructData : public DataSource {
 public:
  InstructData(std::vector<InstructSample> train, std::vector<InstructSample> val, const InstructOptions& o,
               int64_t vocab, int32_t pad, std::string style, size_t dropped)
      : train_(std::move(train)), val_(std::move(val)), o_(o), vocab_(vocab), pad_(pad), style_(std::move(style)),
        dropped_(dropped) {}
  std::string name() const override {
    return "instruct(" + o_.data + ", " + std::to_string(train_.size()) + " train + " + std::to_string(val_.size()) +
           " held-out records, prompt style " + style_ + (o_.mask_prompt ? ", prompt masked" : "") +
           (dropped_ ? ", " + std::to_string(dropped_) + " dropped: prompt fills the block" : "") + ")";
  }
  Batch train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override {
    const int64_t first = first_sample_of(index, batch_size, shard);
    return batch_of(batch_size, [&](int64_t row) {
      return &train_[sample_hash(o_.seed ^ kInstructTrain, uint64_t(first + row)) % train_.size()];
    });
  }
  Batch val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const override {
    const int64_t first = first_sample_of(index, batch_size, shard);
    return batch_of(batch_size, [&](int64_t row) { return &val_[size_t(first + row) % val_.size()]; });
  }
  int64_t num_val_samples() const override { return int64_t(val_.size()); }
  int64_t vocab_size() const override { return vocab_; }
  int64_t block_size() const override { return o_.block_size; }

 private:
  template <typename Pick>
  Batch batch_of(int64_t rows, const Pick& pick) const {
    const int64_t T = o_.block_size;
    Batch b{torch::full({rows, T}, int64_t(pad_), torch::kLong), torch::full({rows, T}, int64_t(-1), torch::kLong)};
    int64_t* in = b.input.data_ptr<int64_t>();
    int64_t* tgt = b.target.data_ptr<int64_t>();
    for (int64_t row = 0; row < rows; ++row) {
      const InstructSample& s = *pick(row);
      for (size_t t = 0; t + 1 < s.ids.size(); ++t) {
        in[row * T + int64_t(t)] = s.ids[t];
        if (s.trained[t + 1] || !o_.mask_prompt) tgt[row * T + int64_t(t)] = s.ids[t + 1];
      }
    }
    return b;
  }
  std::vector<InstructSample> train_, val_;
  InstructOptions o_;
  int64_t vocab_;
  int32_t pad_;
  std::string style_;
  size_t dropped_;
};

}  // namespace

bool is_instruct_data(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".json") return true;
  if (ext != ".jsonl") return false;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line) && line.find_first_not_of(" \t\r") == std::string::npos) {
  }
  try {
    const json j = json::parse(line);
    return j.is_object() && (j.contains("instruction") || j.contains("messages"));
  } catch (const json::exception&) {
    return false;  // the pretraining reader names the line
  }
}

std::vector<InstructRecord> read_instruct_records(const std::string& path) {
  const std::string text = read_all(path);
  std::vector<InstructRecord> records;
  if (fs::path(path).extension() == ".json") {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      TORCH_CHECK_VALUE(false, "'", path, "' is not JSON: ", e.what());
    }
    TORCH_CHECK_VALUE(j.is_array(), "'", path, "': expected a JSON list of records, got ", j.type_name());
    for (size_t i = 0; i < j.size(); ++i) records.push_back(record_of(j[i], "'" + path + "' record " + std::to_string(i + 1)));
  } else {
    size_t start = 0, line = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string_view l(text.data() + start, end - start);
      start = end + 1;
      ++line;
      if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = "'" + path + "' line " + std::to_string(line);
      json j;
      try {
        j = json::parse(l);
      } catch (const json::exception& e) {
        TORCH_CHECK_VALUE(false, where, " is not JSON: ", e.what());
      }
      records.push_back(record_of(j, where));
    }
  }
  TORCH_CHECK_VALUE(!records.empty(), "'", path, "' holds no records");
  return records;
}

InstructSample tokenize_record(const InstructRecord& record, const PromptStyle& style, const Tokenizer& tok,
                               int32_t eos, size_t max_tokens) {
  InstructSample s;
  bool first = true;
  for (const PromptSegment& seg : style.render(record)) {
    // The post-processor's BOS before Alpaca's prompt (the chat styles write theirs).
    const auto ids = tok.encode(seg.text, first && style.appends_eos());
    first = false;
    s.ids.insert(s.ids.end(), ids.begin(), ids.end());
    s.trained.insert(s.trained.end(), ids.size(), seg.trained ? 1 : 0);
  }
  if (style.appends_eos() && eos >= 0) {
    s.ids.push_back(eos);
    s.trained.push_back(1);
  }
  if (s.ids.size() > max_tokens) {
    s.ids.resize(max_tokens);
    s.trained.resize(max_tokens);
  }
  return s;
}

std::unique_ptr<DataSource> make_instruct_data(const InstructOptions& o) {
  TORCH_CHECK_VALUE(o.block_size > 0, "block size must be > 0, got ", o.block_size);
  const auto tok = load_tokenizer(o.tokenizer);
  const std::string style_name = o.prompt_style == "auto" ? prompt_style_for(o.tokenizer) : o.prompt_style;
  const auto style = make_prompt_style(style_name);
  const int32_t eos = tokenizer_eos_id(*tok, o.tokenizer);
  auto records = read_instruct_records(o.data);
  std::vector<InstructRecord> val_records;
  if (!o.val_data.empty()) {
    val_records = read_instruct_records(o.val_data);
  } else {
    // Held out: every record whose seeded hash falls in 1/20 (at least one, never all).
    std::vector<InstructRecord> train;
    for (size_t i = 0; i < records.size(); ++i) {
      (sample_hash(o.seed ^ kInstructSplit, i) % 20 == 0 ? val_records : train).push_back(std::move(records[i]));
    }
    if (val_records.empty() && !train.empty()) val_records.push_back(train.back()), train.pop_back();
    TORCH_CHECK_VALUE(!train.empty(), "'", o.data, "' has ", val_records.size(),
                      " record(s): too few to hold some out; give --val-data");
    records = std::move(train);
  }
  const size_t max_tokens = size_t(o.block_size) + 1;
  auto samples = tokenize_all(records, *style, *tok, eos, max_tokens);
  auto val = tokenize_all(val_records, *style, *tok, eos, max_tokens);
  // Nothing to train in a sample whose answer starts past the block.
  const size_t before = samples.size();
  auto untrainable = [](const InstructSample& s) {
    return std::none_of(s.trained.begin() + (s.trained.empty() ? 0 : 1), s.trained.end(), [](uint8_t t) { return t; });
  };
  std::erase_if(samples, untrainable);
  std::erase_if(val, untrainable);
  TORCH_CHECK_VALUE(!samples.empty() && !val.empty(), "every record's prompt fills block size ", o.block_size,
                    " (nothing to train); give a larger --block-size");
  return std::make_unique<InstructData>(std::move(samples), std::move(val), o, tok->vocab_size(), std::max(eos, 0),
                                        style->name(), before - samples.size());
}

}  // namespace strata::recipes
