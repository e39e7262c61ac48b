#pragma once
// Runs the real strata-gpt binary (multi-process tests go through the actual
// launcher) and captures exit code, output and wall time.
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace strata::testing {

struct BinaryRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr interleaved
  double seconds = 0.0;
};

inline BinaryRun run_gpt_binary(const std::string& args, const std::string& env = "") {
  const std::string command = env + (env.empty() ? "" : " ") + STRATA_GPT_BINARY " " + args + " 2>&1";
  BinaryRun run;
  const auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), pipe) != nullptr) run.output += buf.data();
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace strata::testing
