#include "callbacks/model_checkpoint.h"

#include "core/atomic_file.h"

#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <utility>

namespace strata {
namespace fs = std::filesystem;

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  TORCH_CHECK(!options_.dirpath().empty(), "ModelCheckpoint: dirpath must not be empty");
  TORCH_CHECK(options_.every_n_train_steps() >= 0,
              "ModelCheckpoint: every_n_train_steps must be >= 0 (0 = off), got ",
              options_.every_n_train_steps(), " (dirpath '", options_.dirpath(), "')");
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, TrainingModule& module,
                                         const StepMetrics& metrics) {
  const int64_t every = options_.every_n_train_steps();
  if (every > 0 && metrics.step % every == 0) save(trainer, metrics.step);
}

void ModelCheckpoint::on_fit_end(Trainer& trainer, TrainingModule& module) {
  const int64_t step = trainer.global_step();
  if (options_.save_last() && step > 0 && step != last_saved_step_) save(trainer, step);
}

void ModelCheckpoint::write_checkpoint(Trainer& trainer, const std::string& dir) {
  trainer.save_checkpoint(dir);
}

void ModelCheckpoint::save(Trainer& trainer, int64_t step) {
  TORCH_CHECK(step >= 0, "ModelCheckpoint: step must be >= 0, got ", step);
  const fs::path root(options_.dirpath());
  const fs::path final_dir = root / checkpoint_dir_name(step);
  const fs::path tmp = root / ("." + checkpoint_dir_name(step) + ".tmp");
  Comm& comm = trainer.strategy().comm();
  const bool zero = trainer.strategy().is_global_zero();
  if (zero) {
    fs::create_directories(root);
    fs::remove_all(tmp);  // left by a run that crashed mid-save
    fs::create_directories(tmp);
  }
  // Why: no rank may start writing into tmp while rank 0 may still be
  // clearing a stale copy of it.
  comm.barrier();
  write_checkpoint(trainer, tmp.string());
  // Why: the rename publishes the checkpoint, so it must wait until every
  // rank has finished writing its part (a shard per rank under sharding).
  comm.barrier();
  if (zero) {
    checkpoint_kill_point("before-rename", 0, step);  // test-only fault injection (trainer/checkpoint.h)
    // Replaces an earlier save of the same step (e.g. after a resume).
    publish_directory(tmp.string(), final_dir.string());
    prune_checkpoints(root.string(), options_.keep_last());
  }
  last_checkpoint_ = final_dir.string();
  last_saved_step_ = step;
}

std::string checkpoint_dir_name(int64_t step) { return "step-" + std::to_string(step); }

std::vector<std::string> find_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    const std::string digits = name.rfind("step-", 0) == 0 ? name.substr(5) : "";
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
      continue;
    found.emplace_back(std::stoll(digits), entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::string latest_checkpoint(const std::string& dir) {
  auto all = find_checkpoints(dir);
  return all.empty() ? "" : all.back();
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last) {
  auto all = find_checkpoints(dir);
  if (keep_last <= 0 || static_cast<int64_t>(all.size()) <= keep_last) return {};
  all.resize(all.size() - static_cast<size_t>(keep_last));  // the oldest ones
  for (const auto& path : all) fs::remove_all(path);
  return all;
}

}  // namespace strata
