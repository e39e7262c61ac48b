#include "strata/recipes/app/tokenize_cli.h"

#include "strata/recipes/app/small_cli.h"
#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <boost/program_options.hpp>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>
#include <vector>

namespace strata::recipes {

namespace {

namespace po = boost::program_options;

struct TokenizeOptions {
  std::string tokenizer, file = "-";
  bool whole = false, decode = false, add_special = false, skip_special = false, report_time = false;
  int threads = 0;
};

std::string read_input(const std::string& file) {
  if (file == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  std::ifstream in(file, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "'", file, "' cannot be read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The lines of `text` without their "\n" (a final "\n" ends the last line).
std::vector<std::string_view> lines_of(const std::string& text) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  for (size_t at; (at = text.find('\n', start)) != std::string::npos; start = at + 1) {
    lines.emplace_back(text.data() + start, at - start);
  }
  if (start < text.size()) lines.emplace_back(text.data() + start, text.size() - start);
  return lines;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  return out;
}

/// Each line's output, on `threads` workers (each its own scratch); the
/// first failing line's error, naming it, is rethrown after all stop.
std::vector<std::string> per_line(const Tokenizer& tok, const TokenizeOptions& o,
                                  const std::vector<std::string_view>& lines) {
  std::vector<std::string> out(lines.size());
  std::vector<std::string> errors(lines.size());
  std::atomic<size_t> next{0};
  constexpr size_t kChunk = 256;
  auto work = [&] {
    const auto scratch = tok.make_scratch();
    for (size_t begin; (begin = next.fetch_add(kChunk)) < lines.size();) {
      for (size_t i = begin; i < std::min(begin + kChunk, lines.size()); ++i) {
        try {
          out[i] = o.decode ? tok.decode(parse_token_ids(lines[i], ""), o.skip_special)
                            : ids_text(tok.encode(lines[i], o.add_special, *scratch));
        } catch (const c10::Error& e) {
          errors[i] = e.what_without_backtrace();
        }
      }
    }
  };
  const int n = std::max(1, o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
  std::vector<std::thread> workers;
  for (int t = 1; t < n; ++t) workers.emplace_back(work);
  work();
  for (auto& w : workers) w.join();
  for (size_t i = 0; i < lines.size(); ++i) {
    TORCH_CHECK_VALUE(errors[i].empty(), "'", o.file, "' line ", i + 1, ": ", errors[i]);
  }
  return out;
}

int tokenize(const TokenizeOptions& o) {
  const auto tok = load_tokenizer(o.tokenizer);
  const std::string input = read_input(o.file);
  const auto start = std::chrono::steady_clock::now();
  std::string output;
  if (o.whole) {
    try {
      output = o.decode ? tok->decode(parse_token_ids(input, ""), o.skip_special) : ids_text(tok->encode(input, o.add_special)) + "\n";
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, "'", o.file, "': ", e.what_without_backtrace());
    }
  } else {
    for (const auto& line : per_line(*tok, o, lines_of(input))) output.append(line).append("\n");
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << output << std::flush;
  if (o.report_time) {
    // For benchmarks: the work alone, without loading the tokenizer or reading and writing files.
    std::cerr << (o.decode ? "decoded " : "encoded ") << input.size() << " bytes in " << seconds << " s" << std::endl;
  }
  return 0;
}

}  // namespace

int run_tokenize(int argc, char** argv) {
  TokenizeOptions o;
  po::options_description desc(
      "strata-tokenize --tokenizer PATH [FILE]: the ids of each line of FILE (stdin: - or none), space-separated, "
      "one line per line; exit 2 on bad input");
  desc.add_options()("help,h", "show this help")(
      "tokenizer", po::value(&o.tokenizer)->required(), "a tokenizer.json, or a directory holding one")(
      "file", po::value(&o.file), "the text (or, with --decode, the ids); - for stdin")(
      "whole", po::bool_switch(&o.whole), "the whole file as one text, its ids on one line")(
      "decode", po::bool_switch(&o.decode), "read lines of ids, print their text")(
      "add-special-tokens", po::bool_switch(&o.add_special), "add the post-processor's tokens (BOS ...) to each text")(
      "skip-special-tokens", po::bool_switch(&o.skip_special), "with --decode: leave special tokens out")(
      "threads", po::value(&o.threads), "encoding threads (default: every core)")(
      "report-time", po::bool_switch(&o.report_time), "print the encoding time (without loading and I/O) on stderr");
  return run_small_cli(argc, argv, desc, "file", [&] {
    TORCH_CHECK_VALUE(o.threads >= 0, "--threads ", o.threads, " is negative; give 0 (every core) or more");
    return tokenize(o);
  });
}

}  // namespace strata::recipes
