// Data sources for the GPT recipes (see data.h).
//
// Every sample is a pure function of (seed, global sample index): a counter-
// based hash (splitmix64) replaces a stateful generator, so any rank can
// compute any sample without seeing the others, and a resumed run sees the
// same data. Sharding: micro-batch `index` of `shard` holds global samples
// [index*B*world + rank*B, +B), so the ranks' batches concatenated are the
// single-process batch of B*world.
#include "strata/recipes/data/data.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <fstream>
#include <iterator>
#include <system_error>

namespace strata::recipes {
namespace {

namespace fs = std::filesystem;

// Stream constants keep the train draws, val draws and the split independent.
constexpr uint64_t kTrainStream = 0x747261696e000001ULL;  // "train"
constexpr uint64_t kValStream = 0x76616c0000000002ULL;    // "val"
constexpr uint64_t kSplitStream = 0x73706c6974000003ULL;  // "split"
constexpr int64_t kAdditionValSamples = 2048;  ///< fixed held-out size for addition
constexpr int64_t kMaxWindowValSamples = 1024; ///< cap for text / token windows
constexpr int kMaxDrawAttempts = 1 << 20;      ///< rejection sampling never gets near this

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Hash of (key, counter); mixing the key first keeps nearby seeds unrelated.
uint64_t hash2(uint64_t key, uint64_t counter) { return splitmix64(splitmix64(key) ^ counter); }

int64_t pow10(int digits) {
  int64_t p = 1;
  for (int i = 0; i < digits; ++i) p *= 10;
  return p;
}

/// Validates the sharding arguments and returns the first global sample index.
int64_t first_sample(int64_t index, int64_t batch_size, ShardInfo shard) {
  TORCH_CHECK(index >= 0, "batch index must be >= 0, got ", index);
  TORCH_CHECK(batch_size > 0, "batch size must be > 0, got ", batch_size);
  TORCH_CHECK(shard.world_size >= 1 && shard.rank >= 0 && shard.rank < shard.world_size,
              "shard rank ", shard.rank, " with world size ", shard.world_size,
              " is invalid; need world size >= 1 and 0 <= rank < world size");
  return (index * shard.world_size + shard.rank) * batch_size;
}

/// A [B, T] input/target pair filled row by row: fill(row, global, in, tgt).
template <typename Fill>
Batch make_batch(int64_t batch_size, int64_t length, int64_t first, Fill fill) {
  Batch batch{torch::empty({batch_size, length}, torch::kLong),
              torch::empty({batch_size, length}, torch::kLong)};
  int64_t* in = batch.input.data_ptr<int64_t>();
  int64_t* tgt = batch.target.data_ptr<int64_t>();
  for (int64_t row = 0; row < batch_size; ++row) {
    fill(first + row, in + row * length, tgt + row * length);
  }
  return batch;
}

/// Input = window[0, T), target = window[1, T+1) starting at `offset` of `data`.
template <typename T>
void copy_window(const TokenSpan<T>& data, int64_t offset, int64_t length, int64_t* in,
                 int64_t* tgt) {
  for (int64_t t = 0; t < length; ++t) {
    in[t] = static_cast<int64_t>(data[offset + t]);
    tgt[t] = static_cast<int64_t>(data[offset + t + 1]);
  }
}

/// Train window j: a uniform offset from hash(seed, j).
template <typename T>
Batch train_windows(const TokenSpan<T>& data, int64_t block_size, uint64_t seed, int64_t first,
                    int64_t batch_size) {
  const auto offsets = static_cast<uint64_t>(data.size()) - static_cast<uint64_t>(block_size);
  return make_batch(batch_size, block_size, first, [&](int64_t j, int64_t* in, int64_t* tgt) {
    const auto offset = static_cast<int64_t>(hash2(seed ^ kTrainStream, j) % offsets);
    copy_window(data, offset, block_size, in, tgt);
  });
}

/// Which of `count` held-out samples global sample j is when a validation
/// uses `used` of them (DataSource::spread_val_batch): evenly spread when
/// used < count, else j mod count.
int64_t held_out_sample(int64_t j, int64_t count, int64_t used) {
  return used > 0 && used < count ? j * count / used : j % count;
}

/// Val window k of num_val: evenly spaced over the held-out part, so the
/// held-out set is the same for every seed and covers the whole part; a
/// validation using `used` windows takes every (num_val/used)-th.
template <typename T>
Batch val_windows(const TokenSpan<T>& data, int64_t block_size, int64_t num_val, int64_t used, int64_t first,
                  int64_t batch_size) {
  const auto offsets = static_cast<int64_t>(data.size()) - block_size;
  return make_batch(batch_size, block_size, first, [&](int64_t j, int64_t* in, int64_t* tgt) {
    const int64_t k = held_out_sample(j, num_val, used);
    copy_window(data, k * offsets / num_val, block_size, in, tgt);
  });
}

/// Rows of addition problems. Row j draws (a, b) uniformly from hash stream
/// (key, j mod wrap, attempt) until the pair's split is `want_val`; the attempt
/// counter is hashed too, so every row stays a pure function of (seed, j).
/// Only the digits + 1 answer tokens are scored.
Batch addition_batch(const AdditionData& data, uint64_t key, bool want_val, int64_t wrap, int64_t used,
                     int64_t first, int64_t batch_size) {
  const auto n = static_cast<uint64_t>(pow10(data.digits()));
  const int64_t length = data.block_size();
  const int64_t first_scored = 2 * data.digits() + 1;  // input position before answer digit 1
  return make_batch(batch_size, length, first, [&](int64_t j, int64_t* in, int64_t* tgt) {
    const uint64_t row_key = hash2(key, static_cast<uint64_t>(held_out_sample(j, wrap, used)));
    for (int attempt = 0;; ++attempt) {
      TORCH_CHECK(attempt < kMaxDrawAttempts, "addition: no pair accepted after ",
                  kMaxDrawAttempts, " draws for sample ", j);
      const uint64_t h = hash2(row_key, static_cast<uint64_t>(attempt));
      const auto a = static_cast<int64_t>(h % n);
      const auto b = static_cast<int64_t>(splitmix64(h) % n);
      if (data.is_val_pair(a, b) != want_val) continue;
      const std::vector<int64_t> seq = data.encode_problem(a, b);
      for (int64_t t = 0; t < length; ++t) {
        in[t] = seq[t];
        tgt[t] = t >= first_scored ? seq[t + 1] : -1;
      }
      return;
    }
  });
}

/// Reads a whole regular file; one-line errors for missing, unreadable or empty files.
std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  TORCH_CHECK(fs::exists(status), "data file '", path, "' does not exist");
  TORCH_CHECK(fs::is_regular_file(status), "data file '", path, "' is not a regular file");
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK(file.good(), "data file '", path, "' exists but cannot be opened for reading");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  TORCH_CHECK(!file.bad(), "data file '", path, "' could not be read completely");
  TORCH_CHECK(!bytes.empty(), "data file '", path, "' is empty");
  return bytes;
}

/// A nanoGPT .bin file: little-endian uint16 tokens, each < vocab_size, at
/// least block_size + 1 of them.
std::vector<uint16_t> read_tokens(const std::string& path, int64_t block_size,
                                  int64_t vocab_size) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  TORCH_CHECK(bytes.size() % 2 == 0, "data file '", path, "' has ", bytes.size(),
              " bytes; a uint16 token file needs an even length");
  std::vector<uint16_t> tokens(bytes.size() / 2);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    TORCH_CHECK(tokens[i] < vocab_size, "data file '", path, "' holds token ", tokens[i],
                " at position ", i, ", which is >= vocab size ", vocab_size,
                " (tokens must be in 0..", vocab_size - 1, ")");
  }
  TORCH_CHECK(static_cast<int64_t>(tokens.size()) >= block_size + 1, "block size ", block_size,
              " is larger than the data: '", path, "' has ", tokens.size(),
              " tokens, and a sample needs block_size + 1 = ", block_size + 1, " tokens");
  return tokens;
}

}  // namespace

// ---------------------------------------------------------------- AdditionData

AdditionData::AdditionData(int digits, uint64_t seed) : digits_(digits), seed_(seed) {
  TORCH_CHECK(digits >= 1 && digits <= 9, "addition digits must be in 1..9, got ", digits);
  // With 100 (1 digit) or 10^4 (2 digits) pairs a split could in principle be
  // one-sided; check so that rejection sampling below always terminates.
  if (digits_ <= 2) {
    const int64_t n = pow10(digits_);
    int64_t val_pairs = 0;
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = 0; b < n; ++b) val_pairs += is_val_pair(a, b) ? 1 : 0;
    TORCH_CHECK(val_pairs > 0 && val_pairs < n * n, "seed ", seed, " splits the ", n * n,
                " pairs of ", digits_, "-digit addition into ", val_pairs,
                " held-out pairs; pick another seed");
  }
}

std::string AdditionData::name() const {
  return "addition(" + std::to_string(digits_) + (digits_ == 1 ? " digit)" : " digits)");
}

int64_t AdditionData::block_size() const { return 3 * digits_ + 2; }

/// 2048 held-out problems for every digit count (with 1 or 2 digits there are
/// fewer distinct held-out pairs, so problems repeat).
int64_t AdditionData::num_val_samples() const { return kAdditionValSamples; }

bool AdditionData::is_val_pair(int64_t a, int64_t b) const {
  const int64_t n = pow10(digits_);
  TORCH_CHECK(a >= 0 && a < n && b >= 0 && b < n, "addition operands ", a, " and ", b,
              " must be in 0..", n - 1, " for ", digits_, " digits");
  return hash2(seed_ ^ kSplitStream, static_cast<uint64_t>(a * n + b)) % 10 == 0;
}

std::vector<int64_t> AdditionData::encode_problem(int64_t a, int64_t b) const {
  const int64_t n = pow10(digits_);
  TORCH_CHECK(a >= 0 && a < n && b >= 0 && b < n, "addition operands ", a, " and ", b,
              " must be in 0..", n - 1, " for ", digits_, " digits");
  std::vector<int64_t> seq;
  seq.reserve(3 * digits_ + 3);
  auto put_digits = [&seq](int64_t value, int count) {  // most significant first, zero-padded
    const size_t start = seq.size();
    for (int i = 0; i < count; ++i, value /= 10) seq.push_back(value % 10);
    std::reverse(seq.begin() + start, seq.end());
  };
  put_digits(a, digits_);
  seq.push_back(10);  // '+'
  put_digits(b, digits_);
  seq.push_back(11);  // '='
  int64_t c = a + b;  // reversed: least significant digit first, so carries flow left to right
  for (int i = 0; i <= digits_; ++i, c /= 10) seq.push_back(c % 10);
  return seq;
}

Batch AdditionData::train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const {
  return addition_batch(*this, seed_ ^ kTrainStream, /*want_val=*/false,
                        std::numeric_limits<int64_t>::max(), /*used=*/0,
                        first_sample(index, batch_size, shard), batch_size);
}

Batch AdditionData::val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const {
  return spread_val_batch(index, batch_size, shard, kAdditionValSamples);
}

Batch AdditionData::spread_val_batch(int64_t index, int64_t batch_size, ShardInfo shard, int64_t used) const {
  return addition_batch(*this, seed_ ^ kValStream, /*want_val=*/true, kAdditionValSamples, used,
                        first_sample(index, batch_size, shard), batch_size);
}

// --------------------------------------------------------------- TextBytesData

TextBytesData::TextBytesData(const std::string& path, int64_t block_size, uint64_t seed)
    : WindowData(block_size, seed), path_(path) {
  TORCH_CHECK(block_size > 0, "block size must be > 0, got ", block_size, " (for '", path, "')");
  std::vector<uint8_t> bytes = read_file_bytes(path);
  const auto total = static_cast<int64_t>(bytes.size());
  // Held out: the last 10%, but at least one sample's worth; the rest trains.
  TORCH_CHECK(total >= 2 * (block_size + 1), "block size ", block_size,
              " is larger than the data: '", path, "' has ", total,
              " bytes, but the train part and the held-out part (the last 10%) each need at "
              "least block_size + 1 = ", block_size + 1, " bytes, so at least ",
              2 * (block_size + 1), " bytes in all");
  const int64_t val_len = std::max(total / 10, block_size + 1);
  const auto all = TokenSpan<uint8_t>::of(std::move(bytes));
  train_ = all.slice(0, size_t(total - val_len));
  val_ = all.slice(size_t(total - val_len), size_t(total));
}

std::string TextBytesData::name() const {
  return "text(" + path_ + ", " + std::to_string(train_.size() + val_.size()) + " bytes)";
}

// ------------------------------------------------------------------ WindowData

template <typename Token>
Batch WindowData<Token>::train_batch(int64_t index, int64_t batch_size, ShardInfo shard) const {
  return train_windows(train_, block_size_, seed_, first_sample(index, batch_size, shard), batch_size);
}

template <typename Token>
Batch WindowData<Token>::val_batch(int64_t index, int64_t batch_size, ShardInfo shard) const {
  return spread_val_batch(index, batch_size, shard, num_val_samples());
}

template <typename Token>
Batch WindowData<Token>::spread_val_batch(int64_t index, int64_t batch_size, ShardInfo shard, int64_t used) const {
  return val_windows(val_, block_size_, num_val_samples(), used, first_sample(index, batch_size, shard), batch_size);
}

template <typename Token>
int64_t WindowData<Token>::num_val_samples() const {
  return std::min<int64_t>(kMaxWindowValSamples, static_cast<int64_t>(val_.size()) - block_size_);
}

template class WindowData<uint8_t>;
template class WindowData<uint16_t>;
template class WindowData<uint32_t>;

// ---------------------------------------------------------------- TokenBinData

TokenBinData::TokenBinData(const std::string& dir, int64_t block_size, int64_t vocab_size,
                           uint64_t seed)
    : WindowData(block_size, seed), dir_(dir), vocab_size_(vocab_size) {
  TORCH_CHECK(block_size > 0, "block size must be > 0, got ", block_size, " (for '", dir, "')");
  TORCH_CHECK(vocab_size >= 1 && vocab_size <= 65536, "vocab size ", vocab_size,
              " is not valid for uint16 tokens in '", dir, "'; allowed: 1..65536");
  train_ = TokenSpan<uint16_t>::of(read_tokens((fs::path(dir) / "train.bin").string(), block_size, vocab_size));
  val_ = TokenSpan<uint16_t>::of(read_tokens((fs::path(dir) / "val.bin").string(), block_size, vocab_size));
}

std::string TokenBinData::name() const {
  return "nanogpt-bin(" + dir_ + ", " + std::to_string(train_.size()) + " train + " +
         std::to_string(val_.size()) + " val tokens, vocab " + std::to_string(vocab_size_) + ")";
}

int64_t first_sample_of(int64_t index, int64_t batch_size, ShardInfo shard) {
  return first_sample(index, batch_size, shard);
}

uint64_t sample_hash(uint64_t key, uint64_t counter) { return hash2(key, counter); }

// ------------------------------------------------------------------- make_data

/// Addition ignores a block_size larger than its natural length (samples keep
/// their natural length; the model may still have a longer context).
std::unique_ptr<DataSource> make_data(const std::string& spec, int64_t block_size,
                                      int64_t vocab_size, uint64_t seed) {
  constexpr int64_t kDefaultBlockSize = 256;
  if (spec == "addition" || spec.rfind("addition:", 0) == 0) {
    int digits = 3;
    if (spec != "addition") {
      const std::string value = spec.substr(9);
      const bool numeric = !value.empty() && value.size() <= 2 &&
                           value.find_first_not_of("0123456789") == std::string::npos;
      TORCH_CHECK(numeric && std::stoi(value) >= 1 && std::stoi(value) <= 9, "data '", spec,
                  "': digits '", value, "' must be an integer in 1..9");
      digits = std::stoi(value);
    }
    auto data = std::make_unique<AdditionData>(digits, seed);
    TORCH_CHECK(block_size <= 0 || block_size >= data->block_size(), "block size ", block_size,
                " is smaller than the ", digits, "-digit addition sequence length ",
                data->block_size(), "; use --block-size 0 (natural) or >= ", data->block_size());
    return data;
  }
  const int64_t block = block_size > 0 ? block_size : kDefaultBlockSize;
  std::error_code ec;
  const auto status = fs::status(spec, ec);
  if (fs::is_directory(status)) {
    return std::make_unique<TokenBinData>(spec, block, vocab_size, seed);
  }
  if (fs::is_regular_file(status)) return std::make_unique<TextBytesData>(spec, block, seed);
  TORCH_CHECK(false, "data '", spec,
              "' is neither 'addition[:DIGITS]', a directory with train.bin/val.bin, nor a "
              "readable text file");
}

}  // namespace strata::recipes
