#pragma once
// Runs the real strata-gpt binary (multi-process tests go through the actual
// launcher), or any command, and captures exit code, output and wall time;
// reads the parameter archives strata-gpt --dump-params writes.
#include <torch/torch.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <sys/wait.h>

namespace strata::testing {

struct BinaryRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr interleaved
  double seconds = 0.0;
};

/// Runs `command` through the shell with stderr folded into stdout.
inline BinaryRun run_command(const std::string& command_line) {
  const std::string command = command_line + " 2>&1";
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

#ifdef STRATA_GPT_BINARY  // the dist tests' binary; unit tests run other commands only
inline BinaryRun run_gpt_binary(const std::string& args, const std::string& env = "") {
  return run_command(env + (env.empty() ? "" : " ") + STRATA_GPT_BINARY " " + args);
}
#endif

/// The tensors of a torch::serialize archive (strata-gpt --dump-params), by key.
inline std::map<std::string, torch::Tensor> load_archive(const std::filesystem::path& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path.string());
  std::map<std::string, torch::Tensor> out;
  for (const auto& key : archive.keys()) {
    torch::Tensor t;
    archive.read(key, t);
    out[key] = t;
  }
  return out;
}

}  // namespace strata::testing
