#pragma once
// The fuzz targets: every parser of a file a user brings, each fed one input
// as that file (docs/testing.md, "Fuzzing"). The same targets run under
// libFuzzer with AddressSanitizer and UndefinedBehaviorSanitizer
// (tests/fuzz/fuzz_main.cpp, scripts/fuzz) and, in the suite, over the
// committed corpus and every input a finding was fixed with
// (tests/fuzz/fuzz_replay_test.cpp).
//
// The contract each target checks is strata's: a file is read, or refused
// with a c10::Error of one line that names the file (the binaries print it
// and exit 2). Any other exception, a message of several lines or one that
// does not name the file is a finding, as is a crash, a leak or undefined
// behaviour (the sanitizers'), or an allocation the input asks for beyond
// the memory cap (libFuzzer's -malloc_limit_mb).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::fuzz {

/// A directory of the process's own (under $TMPDIR), where a target writes
/// the input as the file it parses; removed, with what is in it, on
/// destruction.
class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  const std::string& dir() const { return dir_; }
  /// `dir()/name` holding `bytes` (replaced; directories made as needed).
  std::string write(const std::string& name, std::string_view bytes) const;
  /// A fresh, empty `dir()/name/`.
  std::string fresh_dir(const std::string& name) const;

 private:
  std::string dir_;
};

/// What a target made of one input.
struct Outcome {
  std::optional<std::string> broken;  ///< the contract broke, and how: a finding
  std::string refused;                ///< the one-line error it was refused with ("": read)
  /// Of two readings of one input: broken if either broke, read if either read.
  Outcome operator|(const Outcome& other) const;
};

struct Target {
  std::string name;
  std::string reads;  ///< the file it parses and through what, for --list
  std::function<Outcome(std::string_view input, const Workspace& ws)> run;
};

/// Every target, in the order scripts/fuzz runs them.
const std::vector<Target>& targets();
/// The target called `name`, or nullptr.
const Target* find_target(const std::string& name);

/// Runs `parse`: read when it returns, refused when it throws a c10::Error
/// whose message (without its backtrace) is one line naming `file`; anything
/// else is broken. What the targets check, public so a test can show it fails.
Outcome read_or_refused(const std::string& file, const std::function<void()>& parse);

}  // namespace strata::fuzz
