// Tests for recipes/data: addition encoding and split, text bytes, nanoGPT
// .bin tokens, make_data, determinism, the sharding contract, and one-line
// errors that name the offending value.
#include "strata/recipes/data/data.h"
#include "tests/temp_dir.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace strata::recipes {
namespace {
using strata::testing::TempDir;

namespace fs = std::filesystem;

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

/// Little-endian uint16, as nanoGPT's prepare.py writes them.
void write_tokens(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::vector<uint8_t> bytes;
  for (uint16_t t : tokens) {
    bytes.push_back(static_cast<uint8_t>(t & 0xff));
    bytes.push_back(static_cast<uint8_t>(t >> 8));
  }
  write_bytes(path, bytes);
}

std::vector<uint16_t> iota_tokens(size_t count, uint16_t start) {
  std::vector<uint16_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), start);
  return tokens;
}

std::vector<uint8_t> random_bytes(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> bytes(count);
  for (auto& b : bytes) b = static_cast<uint8_t>(gen() & 0xff);
  return bytes;
}

/// The message of the c10::Error `fn` throws ("" and a test failure if none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "expected a c10::Error";
  return "";
}

/// Expects a one-line error that contains every needle.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  const std::string message = error_of(fn);
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const auto& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message '" << message << "' lacks '" << needle << "'";
  }
}

bool same(const Batch& x, const Batch& y) {
  return torch::equal(x.input, y.input) && torch::equal(x.target, y.target);
}

/// N ranks with batch B, concatenated, equal one process with batch N*B.
void expect_sharding_contract(const DataSource& data, bool val) {
  auto get = [&](int64_t index, int64_t batch, ShardInfo shard) {
    return val ? data.val_batch(index, batch, shard) : data.train_batch(index, batch, shard);
  };
  constexpr int64_t kBatch = 3;
  for (int world : {2, 3}) {
    for (int64_t index : {0, 1, 7}) {
      std::vector<torch::Tensor> inputs, targets;
      for (int rank = 0; rank < world; ++rank) {
        Batch b = get(index, kBatch, ShardInfo{rank, world});
        ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{kBatch, data.block_size()}));
        inputs.push_back(b.input);
        targets.push_back(b.target);
      }
      const Batch single = get(index, kBatch * world, ShardInfo{0, 1});
      EXPECT_TRUE(torch::equal(torch::cat(inputs), single.input))
          << data.name() << " world " << world << " index " << index << (val ? " val" : " train");
      EXPECT_TRUE(torch::equal(torch::cat(targets), single.target))
          << data.name() << " world " << world << " index " << index << (val ? " val" : " train");
    }
  }
  // Sample j does not depend on the batch size: batch 1 of size 4 = rows 4..8 of batch 0 of size 8.
  const Batch small = get(1, 4, ShardInfo{});
  const Batch large = get(0, 8, ShardInfo{});
  EXPECT_TRUE(torch::equal(small.input, large.input.slice(0, 4, 8)));
}

/// Decodes one addition row (input + last target) into (a, b, answer).
struct Problem {
  int64_t a = 0, b = 0, answer = 0;
};
Problem decode(const torch::Tensor& input, const torch::Tensor& target, int digits) {
  std::vector<int64_t> seq(input.data_ptr<int64_t>(), input.data_ptr<int64_t>() + input.numel());
  seq.push_back(target[-1].item<int64_t>());
  Problem p;
  for (int i = 0; i < digits; ++i) {
    p.a = p.a * 10 + seq[i];
    p.b = p.b * 10 + seq[digits + 1 + i];
  }
  EXPECT_EQ(seq[digits], 10);          // '+'
  EXPECT_EQ(seq[2 * digits + 1], 11);  // '='
  for (int i = digits; i >= 0; --i) p.answer = p.answer * 10 + seq[2 * digits + 2 + i];
  return p;
}

// ---------------------------------------------------------------- addition

TEST(AdditionDataTest, EncodesAKnownProblem) {
  AdditionData data(3, 1);
  // 123+456=579 -> answer reversed and zero-padded: 9 7 5 0.
  EXPECT_EQ(data.encode_problem(123, 456),
            (std::vector<int64_t>{1, 2, 3, 10, 4, 5, 6, 11, 9, 7, 5, 0}));
  // Operands zero-padded; a carry into the extra digit: 999+1=1000 -> 0 0 0 1.
  EXPECT_EQ(data.encode_problem(999, 1),
            (std::vector<int64_t>{9, 9, 9, 10, 0, 0, 1, 11, 0, 0, 0, 1}));
  EXPECT_EQ(AdditionData(2, 1).encode_problem(5, 7),
            (std::vector<int64_t>{0, 5, 10, 0, 7, 11, 2, 1, 0}));
  EXPECT_EQ(data.block_size(), 11);
  EXPECT_EQ(data.vocab_size(), 12);
  EXPECT_TRUE(data.has_accuracy());
  EXPECT_EQ(data.name(), "addition(3 digits)");
}

TEST(AdditionDataTest, ScoresOnlyTheAnswerTokens) {
  for (int digits : {1, 3, 9}) {
    AdditionData data(digits, 7);
    for (const Batch& b : {data.train_batch(0, 64, {}), data.val_batch(0, 64, {})}) {
      const int64_t length = 3 * digits + 2;
      ASSERT_EQ(b.input.sizes(), (std::vector<int64_t>{64, length}));
      ASSERT_EQ(b.target.sizes(), (std::vector<int64_t>{64, length}));
      EXPECT_EQ(b.input.scalar_type(), torch::kLong);
      EXPECT_EQ(b.target.scalar_type(), torch::kLong);
      const int64_t first_scored = 2 * digits + 1;
      EXPECT_TRUE((b.target.slice(1, 0, first_scored) == -1).all().item<bool>());
      // Scored targets are the next input token, and are digits.
      const auto answer = b.target.slice(1, first_scored);
      EXPECT_TRUE(((answer >= 0) & (answer <= 9)).all().item<bool>());
      EXPECT_TRUE(torch::equal(b.target.slice(1, first_scored, length - 1),
                               b.input.slice(1, first_scored + 1)));
      EXPECT_EQ(answer.size(1), digits + 1);
    }
  }
}

TEST(AdditionDataTest, AnswersAreTheCorrectSums) {
  for (int digits = 1; digits <= 9; ++digits) {
    AdditionData data(digits, 1234 + digits);
    for (const Batch& b : {data.train_batch(3, 200, {}), data.val_batch(0, 200, {})}) {
      for (int64_t row = 0; row < 200; ++row) {
        const Problem p = decode(b.input[row], b.target[row], digits);
        ASSERT_EQ(p.a + p.b, p.answer) << "digits " << digits << " row " << row;
      }
    }
  }
}

TEST(AdditionDataTest, TrainAndValPairsAreDisjoint) {
  for (int digits : {1, 2, 3}) {
    AdditionData data(digits, 99);
    const Batch train = data.train_batch(0, 2000, {});
    const Batch val = data.val_batch(0, data.num_val_samples(), {});
    for (int64_t row = 0; row < 2000; ++row) {
      const Problem p = decode(train.input[row], train.target[row], digits);
      ASSERT_FALSE(data.is_val_pair(p.a, p.b)) << p.a << "+" << p.b;
    }
    for (int64_t row = 0; row < data.num_val_samples(); ++row) {
      const Problem p = decode(val.input[row], val.target[row], digits);
      ASSERT_TRUE(data.is_val_pair(p.a, p.b)) << p.a << "+" << p.b;
    }
  }
}

TEST(AdditionDataTest, HoldsOutAboutTenPercentOfPairs) {
  AdditionData data(2, 5);
  int val = 0;
  for (int a = 0; a < 100; ++a)
    for (int b = 0; b < 100; ++b) val += data.is_val_pair(a, b) ? 1 : 0;
  EXPECT_GT(val, 800);
  EXPECT_LT(val, 1200);
  EXPECT_EQ(data.num_val_samples(), 2048);
}

TEST(AdditionDataTest, IsDeterministicBySeed) {
  const Batch a = AdditionData(3, 42).train_batch(5, 16, {});
  EXPECT_TRUE(same(a, AdditionData(3, 42).train_batch(5, 16, {})));
  EXPECT_FALSE(same(a, AdditionData(3, 43).train_batch(5, 16, {})));
  EXPECT_FALSE(same(a, AdditionData(3, 42).train_batch(6, 16, {})));
  EXPECT_TRUE(same(AdditionData(3, 42).val_batch(2, 16, {}),
                   AdditionData(3, 42).val_batch(2, 16, {})));
}

TEST(AdditionDataTest, ValIndicesWrapAtNumValSamples) {
  AdditionData data(3, 3);
  const int64_t n = data.num_val_samples();
  EXPECT_TRUE(same(data.val_batch(0, 8, {}), data.val_batch(n / 8, 8, {})));
  // Wrap inside one batch: n = 2048, so batch 341 of 6 holds samples 2046, 2047, 0, 1, 2, 3.
  ASSERT_EQ(n, 2048);
  const Batch tail = data.val_batch(341, 6, {});
  EXPECT_TRUE(torch::equal(tail.input.slice(0, 2, 6), data.val_batch(0, 4, {}).input));
  EXPECT_TRUE(torch::equal(tail.target.slice(0, 2, 6), data.val_batch(0, 4, {}).target));
}

TEST(AdditionDataTest, APartialValidationSpreadsOverTheHeldOutRows) {
  // 2048 held-out rows; a validation of 32 samples takes rows 0, 64, 128, ...
  AdditionData data(3, 3);
  const Batch spread = data.spread_val_batch(0, 32, {}, 32);
  for (int64_t j = 0; j < 32; ++j) {
    const Batch row = data.val_batch(j * 64, 1, {});
    EXPECT_TRUE(torch::equal(spread.input[j], row.input[0])) << "sample " << j;
  }
  EXPECT_FALSE(same(spread, data.val_batch(0, 32, {})));
}

TEST(AdditionDataTest, ShardingContract) {
  AdditionData data(3, 11);
  expect_sharding_contract(data, /*val=*/false);
  expect_sharding_contract(data, /*val=*/true);
}

TEST(AdditionDataTest, RejectsBadInput) {
  expect_error([] { AdditionData(0, 1); }, {"0", "1..9"});
  expect_error([] { AdditionData(10, 1); }, {"10", "1..9"});
  expect_error([] { AdditionData(-2, 1); }, {"-2", "1..9"});
  AdditionData data(2, 1);
  expect_error([&] { data.encode_problem(100, 1); }, {"100", "0..99"});
  expect_error([&] { data.is_val_pair(1, -1); }, {"-1", "0..99"});
  expect_error([&] { data.train_batch(0, 0, {}); }, {"batch size", "0"});
  expect_error([&] { data.train_batch(-1, 4, {}); }, {"-1"});
  expect_error([&] { data.train_batch(0, 4, ShardInfo{2, 2}); }, {"rank 2", "world size 2"});
  expect_error([&] { data.val_batch(0, 4, ShardInfo{0, 0}); }, {"world size 0"});
}

// ------------------------------------------------------------------- text

TEST(TextBytesDataTest, SamplesWindowsFromTheTrainAndValParts) {
  TempDir dir;
  const std::string path = dir.file("input.txt");
  std::vector<uint8_t> bytes = random_bytes(3000, 1);
  const std::string utf8 = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac";  // héllo wörld €
  std::copy(utf8.begin(), utf8.end(), bytes.begin());
  write_bytes(path, bytes);

  TextBytesData data(path, 16, 7);
  EXPECT_EQ(data.vocab_size(), 256);
  EXPECT_EQ(data.block_size(), 16);
  EXPECT_FALSE(data.has_accuracy());
  EXPECT_EQ(data.name(), "text(" + path + ", 3000 bytes)");
  EXPECT_EQ(data.num_val_samples(), 300 - 16);  // last 10% = 300 bytes

  const auto train_end = bytes.begin() + 2700;
  auto check = [&](const Batch& b, bool val) {
    EXPECT_TRUE(torch::equal(b.target.slice(1, 0, 15), b.input.slice(1, 1)));
    for (int64_t row = 0; row < b.input.size(0); ++row) {
      std::vector<uint8_t> window;
      for (int64_t t = 0; t < 16; ++t) {
        window.push_back(static_cast<uint8_t>(b.input[row][t].item<int64_t>()));
      }
      window.push_back(static_cast<uint8_t>(b.target[row][15].item<int64_t>()));
      const auto lo = val ? train_end : bytes.begin();
      const auto hi = val ? bytes.end() : train_end;
      EXPECT_NE(std::search(lo, hi, window.begin(), window.end()), hi)
          << "row " << row << " is not a window of the " << (val ? "val" : "train") << " part";
    }
  };
  check(data.train_batch(0, 64, {}), false);
  check(data.val_batch(0, 64, {}), true);
  // Every byte (UTF-8 lead and continuation bytes included) is just a token in 0..255.
  const Batch b = data.train_batch(0, 256, {});
  EXPECT_TRUE(((b.input >= 0) & (b.input <= 255)).all().item<bool>());
  EXPECT_GT(b.input.max().item<int64_t>(), 127);
}

TEST(TextBytesDataTest, IsDeterministicAndSharded) {
  TempDir dir;
  const std::string path = dir.file("input.txt");
  write_bytes(path, random_bytes(2000, 2));
  TextBytesData data(path, 8, 3);
  EXPECT_TRUE(same(data.train_batch(4, 8, {}), TextBytesData(path, 8, 3).train_batch(4, 8, {})));
  EXPECT_FALSE(same(data.train_batch(4, 8, {}), TextBytesData(path, 8, 4).train_batch(4, 8, {})));
  expect_sharding_contract(data, /*val=*/false);
  expect_sharding_contract(data, /*val=*/true);
}

TEST(TextBytesDataTest, APartialValidationSpreadsOverTheWholeHeldOutPartAtEveryWorldSize) {
  // 300 held-out bytes, block 4: 296 windows. A validation of 2 batches x 8
  // samples uses 16 of them: window floor(j * 296 / 16) for sample j, i.e.
  // every 18.5th, from the first to the last stretch -- not windows 0..15.
  TempDir dir;
  const std::string path = dir.file("input.txt");
  const std::vector<uint8_t> bytes = random_bytes(3000, 5);
  write_bytes(path, bytes);
  TextBytesData data(path, 4, 1);
  const int64_t n = data.num_val_samples();
  ASSERT_EQ(n, 296);
  const int64_t used = 16;
  auto window_start = [&](const torch::Tensor& row) {
    std::vector<uint8_t> w;
    for (int64_t t = 0; t < 4; ++t) w.push_back(static_cast<uint8_t>(row[t].item<int64_t>()));
    const auto it = std::search(bytes.begin() + 2700, bytes.end(), w.begin(), w.end());
    return static_cast<int64_t>(it - (bytes.begin() + 2700));
  };
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < 2; ++i) {
    const Batch b = data.spread_val_batch(i, 8, {}, used);
    for (int64_t r = 0; r < 8; ++r) starts.push_back(window_start(b.input[r]));
  }
  for (int64_t j = 0; j < used; ++j) EXPECT_EQ(starts[j], j * n / used) << "sample " << j;
  EXPECT_GT(starts.back(), 270) << "the last used window is near the end of the held-out part";
  // The same samples when 2 ranks each take 4 of each global batch of 8.
  for (int64_t i = 0; i < 2; ++i) {
    const Batch whole = data.spread_val_batch(i, 8, {}, used);
    for (int rank = 0; rank < 2; ++rank) {
      const Batch part = data.spread_val_batch(i, 4, {rank, 2}, used);
      EXPECT_TRUE(torch::equal(part.input, whole.input.slice(0, 4 * rank, 4 * rank + 4))) << i << " " << rank;
    }
  }
  // Using everything is the plain held-out order.
  EXPECT_TRUE(same(data.spread_val_batch(3, 8, {}, n), data.val_batch(3, 8, {})));
}

TEST(TextBytesDataTest, RejectsBadInput) {
  TempDir dir;
  const std::string missing = dir.file("missing.txt");
  expect_error([&] { TextBytesData(missing, 8, 1); }, {missing, "does not exist"});
  expect_error([&] { TextBytesData(dir.path().string(), 8, 1); },
               {dir.path().string(), "not a regular file"});
  const std::string empty = dir.file("empty.txt");
  write_bytes(empty, {});
  expect_error([&] { TextBytesData(empty, 8, 1); }, {empty, "empty"});
  const std::string short_file = dir.file("short.txt");
  write_bytes(short_file, random_bytes(100, 3));
  expect_error([&] { TextBytesData(short_file, 256, 1); },
               {"block size 256", short_file, "100 bytes", "257", "514"});
  // 2*(b+1) bytes is exactly enough; one less is not.
  write_bytes(short_file, random_bytes(18, 3));
  EXPECT_NO_THROW(TextBytesData(short_file, 8, 1));
  write_bytes(short_file, random_bytes(17, 3));
  expect_error([&] { TextBytesData(short_file, 8, 1); }, {"block size 8", "17 bytes"});
  expect_error([&] { TextBytesData(short_file, 0, 1); }, {"block size", "0"});
  expect_error([&] { TextBytesData(short_file, -3, 1); }, {"-3"});
}

TEST(TextBytesDataTest, RejectsAnUnreadableFile) {
  TempDir dir;
  const std::string path = dir.file("secret.txt");
  write_bytes(path, random_bytes(100, 4));
  fs::permissions(path, fs::perms::none);
  if (std::ifstream(path).good()) {
    GTEST_SKIP() << "this user (root?) can read a mode-000 file, so 'unreadable' cannot be staged";
  }
  expect_error([&] { TextBytesData(path, 8, 1); }, {path, "cannot be opened"});
}

// ------------------------------------------------------------ nanoGPT .bin

TEST(TokenBinDataTest, ReadsLittleEndianTokens) {
  TempDir dir;
  // Consecutive ids crossing byte boundaries (255 -> 256) catch a wrong byte order.
  write_tokens(dir.file("train.bin"), iota_tokens(1000, 0));
  write_tokens(dir.file("val.bin"), iota_tokens(200, 1000));
  TokenBinData data(dir.path().string(), 8, 1200, 5);
  EXPECT_EQ(data.vocab_size(), 1200);
  EXPECT_EQ(data.block_size(), 8);
  EXPECT_EQ(data.num_val_samples(), 200 - 8);
  EXPECT_NE(data.name().find("nanogpt-bin(" + dir.path().string()), std::string::npos);

  auto check = [](const Batch& b, int64_t lo, int64_t hi) {
    const auto steps = torch::arange(8, torch::kLong);
    for (int64_t row = 0; row < b.input.size(0); ++row) {
      const int64_t start = b.input[row][0].item<int64_t>();
      EXPECT_TRUE(torch::equal(b.input[row], steps + start)) << b.input[row];
      EXPECT_TRUE(torch::equal(b.target[row], steps + start + 1)) << b.target[row];
      EXPECT_GE(start, lo);
      EXPECT_LE(start + 8, hi);
    }
  };
  check(data.train_batch(0, 128, {}), 0, 999);
  check(data.val_batch(0, 128, {}), 1000, 1199);
  // Val windows are spread evenly over val.bin: first at 1000, last near the end.
  const Batch all_val = data.val_batch(0, data.num_val_samples(), {});
  EXPECT_EQ(all_val.input[0][0].item<int64_t>(), 1000);
  EXPECT_EQ(all_val.input[-1][0].item<int64_t>(), 1000 + 200 - 8 - 1);
}

TEST(TokenBinDataTest, IsDeterministicAndSharded) {
  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(500, 0));
  write_tokens(dir.file("val.bin"), iota_tokens(100, 0));
  TokenBinData data(dir.path().string(), 4, 500, 9);
  EXPECT_TRUE(same(data.train_batch(2, 8, {}),
                   TokenBinData(dir.path().string(), 4, 500, 9).train_batch(2, 8, {})));
  EXPECT_FALSE(same(data.train_batch(2, 8, {}),
                    TokenBinData(dir.path().string(), 4, 500, 10).train_batch(2, 8, {})));
  expect_sharding_contract(data, /*val=*/false);
  expect_sharding_contract(data, /*val=*/true);
}

TEST(TokenBinDataTest, RejectsBadInput) {
  TempDir dir;
  const std::string d = dir.path().string();
  const std::string train = dir.file("train.bin"), val = dir.file("val.bin");
  expect_error([&] { TokenBinData(d, 8, 100, 1); }, {train, "does not exist"});
  write_tokens(train, iota_tokens(50, 0));
  expect_error([&] { TokenBinData(d, 8, 100, 1); }, {val, "does not exist"});
  write_bytes(val, {});
  expect_error([&] { TokenBinData(d, 8, 100, 1); }, {val, "empty"});
  write_bytes(val, random_bytes(1001, 5));
  expect_error([&] { TokenBinData(d, 8, 100, 1); }, {val, "1001 bytes", "even length"});
  std::vector<uint16_t> tokens = iota_tokens(50, 0);
  tokens[17] = 300;
  write_tokens(val, tokens);
  expect_error([&] { TokenBinData(d, 8, 100, 1); },
               {val, "token 300", "position 17", "vocab size 100"});
  write_tokens(val, iota_tokens(50, 0));
  EXPECT_NO_THROW(TokenBinData(d, 8, 100, 1));
  expect_error([&] { TokenBinData(d, 256, 100, 1); }, {"block size 256", "50 tokens", "257"});
  expect_error([&] { TokenBinData(d, 0, 100, 1); }, {"block size", "0"});
  expect_error([&] { TokenBinData(d, 8, 0, 1); }, {"vocab size 0", "1..65536"});
  expect_error([&] { TokenBinData(d, 8, 70000, 1); }, {"vocab size 70000", "1..65536"});
}

// -------------------------------------------------------------- make_data

TEST(MakeDataTest, BuildsEachKind) {
  auto addition = make_data("addition", 0, 50257, 1);
  EXPECT_EQ(addition->name(), "addition(3 digits)");
  EXPECT_EQ(addition->block_size(), 11);
  EXPECT_EQ(make_data("addition:5", -1, 0, 1)->block_size(), 17);
  EXPECT_EQ(make_data("addition:1", 0, 0, 1)->name(), "addition(1 digit)");
  // A longer block is allowed; samples keep their natural length.
  EXPECT_EQ(make_data("addition:2", 64, 0, 1)->block_size(), 8);
  EXPECT_EQ(make_data("addition:2", 8, 0, 1)->block_size(), 8);

  TempDir dir;
  write_tokens(dir.file("train.bin"), iota_tokens(600, 0));
  write_tokens(dir.file("val.bin"), iota_tokens(300, 0));
  auto bin = make_data(dir.path().string(), 0, 1000, 1);
  EXPECT_EQ(bin->block_size(), 256);
  EXPECT_EQ(bin->vocab_size(), 1000);
  EXPECT_NE(bin->name().find("nanogpt-bin"), std::string::npos);
  EXPECT_EQ(make_data(dir.path().string(), 32, 1000, 1)->block_size(), 32);

  const std::string text_path = dir.file("input.txt");
  write_bytes(text_path, random_bytes(1000, 6));
  auto text = make_data(text_path, 0, 0, 1);
  EXPECT_EQ(text->block_size(), 256);
  EXPECT_EQ(text->vocab_size(), 256);
  EXPECT_EQ(text->name(), "text(" + text_path + ", 1000 bytes)");
  EXPECT_EQ(make_data(text_path, 64, 0, 1)->block_size(), 64);
}

TEST(MakeDataTest, RejectsBadSpecs) {
  for (const std::string digits : {"0", "10", "x", "", "-1", "3x", "123"}) {
    expect_error([&] { make_data("addition:" + digits, 0, 0, 1); },
                 {"'addition:" + digits + "'", "1..9"});
  }
  expect_error([] { make_data("addition:3", 5, 0, 1); }, {"block size 5", "11"});
  expect_error([] { make_data("xyz_no_such_data", 0, 0, 1); },
               {"data 'xyz_no_such_data' is neither 'addition[:DIGITS]'", "train.bin/val.bin",
                "text file"});
  TempDir dir;  // a directory without train.bin
  expect_error([&] { make_data(dir.path().string(), 0, 100, 1); }, {"train.bin"});
}

}  // namespace
}  // namespace strata::recipes
