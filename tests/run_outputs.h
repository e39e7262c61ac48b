#pragma once
// Reading what a strata-gpt run left (metrics.csv) and talking to the venv's
// Python oracle (a script printing key=value lines); shared by the tests that
// run the real binaries.
#include "tests/run_binary.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace strata::testing {

/// One column of metrics.csv's training rows (those with a loss; validation
/// rows leave it empty), in step order, as written.
inline std::vector<std::string> metrics_column(const std::filesystem::path& metrics, const std::string& name) {
  std::ifstream in(metrics);
  auto cells = [](const std::string& row) {
    std::vector<std::string> out;
    std::stringstream ss(row);
    for (std::string cell; std::getline(ss, cell, ',');) out.push_back(cell);
    if (!row.empty() && row.back() == ',') out.emplace_back();
    return out;
  };
  std::string line;
  std::vector<std::string> values;
  if (!std::getline(in, line)) return values;
  const auto header = cells(line);
  const size_t col = std::find(header.begin(), header.end(), name) - header.begin();
  const size_t loss = std::find(header.begin(), header.end(), "loss") - header.begin();
  while (std::getline(in, line)) {
    const auto row = cells(line);
    if (col < row.size() && loss < row.size() && !row[loss].empty()) values.push_back(row[col]);
  }
  return values;
}

/// The first training row's loss (step 1 when every step is logged).
inline double first_logged_loss(const std::filesystem::path& metrics) {
  const auto losses = metrics_column(metrics, "loss");
  if (losses.empty()) {
    ADD_FAILURE() << "no loss in " << metrics;
    return 0.0;
  }
  return std::stod(losses.front());
}

/// Runs `python script args` (the script written to `script` first if it is
/// not there); the "key=value" lines it printed. A failing script fails the test.
inline std::map<std::string, std::string> run_python(const std::string& python, const std::filesystem::path& script,
                                                     const char* script_text, const std::string& args) {
  if (!std::filesystem::exists(script)) std::ofstream(script) << script_text;
  const auto run = run_command(python + " " + script.string() + " " + args);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::map<std::string, std::string> out;
  std::istringstream lines(run.output);
  for (std::string line; std::getline(lines, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

/// Tensors as a pickled Dict[str, Tensor] that Python's torch.load reads.
inline void save_dict(const std::filesystem::path& path, const std::map<std::string, torch::Tensor>& tensors) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [k, v] : tensors) dict.insert(k, v);
  const auto bytes = torch::pickle_save(c10::IValue(dict));
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A directory for one test binary's runs: the system's temporary directory's
/// `name`-PID, created.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

/// nanoGPT-format data in `dir` (made once): train.bin and val.bin of 8192
/// uint16 tokens below `vocab` each, from a fixed seed.
inline std::filesystem::path random_token_data(const std::filesystem::path& dir, int vocab) {
  if (std::filesystem::exists(dir / "val.bin")) return dir;
  std::filesystem::create_directories(dir);
  std::mt19937 rng(7);
  for (const char* name : {"train.bin", "val.bin"}) {
    std::vector<uint16_t> tokens(8192);
    for (auto& t : tokens) t = static_cast<uint16_t>(rng() % static_cast<unsigned>(vocab));
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  }
  return dir;
}

}  // namespace strata::testing
