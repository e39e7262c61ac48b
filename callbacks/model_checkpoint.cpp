#include "strata/callbacks/model_checkpoint.h"

#include "strata/core/atomic_file.h"

#include "strata/trainer/checkpoint.h"
#include "strata/trainer/trainer.h"

#include <c10/util/StringUtil.h>
#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <utility>

namespace strata {
namespace fs = std::filesystem;

std::vector<std::string> checkpoint_monitor_names() { return {"val_loss", "val_accuracy", "loss"}; }

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  TORCH_CHECK(!options_.dirpath().empty(), "ModelCheckpoint: dirpath must not be empty");
  TORCH_CHECK(options_.every_n_train_steps() >= 0,
              "ModelCheckpoint: every_n_train_steps must be >= 0 (0 = off), got ",
              options_.every_n_train_steps(), " (dirpath '", options_.dirpath(), "')");
  const auto names = checkpoint_monitor_names();
  TORCH_CHECK(options_.monitor().empty() ||
                  std::find(names.begin(), names.end(), options_.monitor()) != names.end(),
              "ModelCheckpoint: monitor must be \"\" (none) or one of ", c10::Join(", ", names), ", got \"",
              options_.monitor(), "\"");
  TORCH_CHECK(options_.save_top_k() >= 1, "ModelCheckpoint: save_top_k must be >= 1, got ",
              options_.save_top_k());
}

void ModelCheckpoint::observe(int64_t step, double value) { current_ = std::make_pair(value, step); }

bool ModelCheckpoint::enters_top_k(double value) const {
  if (!std::isfinite(value)) return false;
  if (static_cast<int64_t>(best_.size()) < options_.save_top_k()) return true;
  return better(options_.mode(), value, best_.back().first);
}

void ModelCheckpoint::warn(Trainer& trainer, const std::string& message) {
  if (!warnings_.empty()) return;  // once
  warnings_.push_back(message);
  if (trainer.strategy().is_global_zero()) std::cerr << "warning: " << message << std::endl;
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, TrainingModule& module,
                                         const StepMetrics& metrics) {
  // The loss handed to callbacks is already the mean over ranks.
  if (options_.monitor() == "loss") observe(metrics.step, metrics.loss);
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, TrainingModule& module,
                                        const ValidationMetrics& metrics) {
  if (options_.monitor() == "val_loss") {
    observe(metrics.step, metrics.loss);
  } else if (options_.monitor() == "val_accuracy") {
    if (metrics.accuracy) {
      observe(metrics.step, *metrics.accuracy);
    } else {
      warn(trainer, "ModelCheckpoint monitors val_accuracy, but the validation at step " +
                        std::to_string(metrics.step) +
                        " reported none (the data defines no accuracy): no best checkpoints are kept");
    }
  }
}

void ModelCheckpoint::on_train_step_end(Trainer& trainer, TrainingModule& module, int64_t step) {
  // Sync point (only while an async save is pending): the ranks agree that
  // every rank's file is written before any publishes it.
  if (pending_ && trainer.strategy().mean_over_ranks(pending_->written() ? 1.0 : 0.0) == 1.0) {
    finish_pending(trainer);
  }
  const int64_t every = options_.every_n_train_steps();
  const bool periodic = every > 0 && step % every == 0;
  const bool candidate = !options_.monitor().empty() && current_ && current_->second == step &&
                         enters_top_k(current_->first);
  if (periodic || candidate) save(trainer, step);
}

void ModelCheckpoint::on_fit_end(Trainer& trainer, TrainingModule& module) {
  if (pending_) finish_pending(trainer);  // fit does not end before its last checkpoint is complete
  const int64_t step = trainer.global_step();
  if (options_.save_last() && step > 0 && step != last_saved_step_) save(trainer, step);
  if (pending_) finish_pending(trainer);
  if (!options_.monitor().empty() && !current_ && best_.empty()) {
    warn(trainer, "ModelCheckpoint monitors " + options_.monitor() +
                      ", but it was never measured in this fit (is validation off?): no best checkpoints are kept");
  }
}

void ModelCheckpoint::write_checkpoint(Trainer& trainer, const std::string& dir) {
  trainer.save_checkpoint(dir);
}

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

fs::path ModelCheckpoint::tmp_dir(int64_t step) const {
  return fs::path(options_.dirpath()) / c10::str(".", checkpoint_dir_name(step), ".tmp");
}

void ModelCheckpoint::save(Trainer& trainer, int64_t step) {
  TORCH_CHECK(step >= 0, "ModelCheckpoint: step must be >= 0, got ", step);
  const auto start = std::chrono::steady_clock::now();
  if (pending_) finish_pending(trainer);  // the next save waits for the previous
  const fs::path root(options_.dirpath());
  const fs::path tmp = tmp_dir(step);
  // The whole job: with tensor parallelism every rank of every group writes its part.
  Comm comm = trainer.strategy().job_comm();
  // Before writing, so the checkpoint's own state lists it among the best.
  // Every rank updates the same list: the scores are rank-reduced.
  if (!options_.monitor().empty() && current_ && current_->second == step && enters_top_k(current_->first)) {
    best_.erase(std::remove_if(best_.begin(), best_.end(), [&](const auto& b) { return b.second == step; }),
                best_.end());
    best_.push_back(*current_);
    std::stable_sort(best_.begin(), best_.end(),
                     [&](const auto& a, const auto& b) { return better(options_.mode(), a.first, b.first); });
    if (static_cast<int64_t>(best_.size()) > options_.save_top_k()) best_.resize(options_.save_top_k());
  }
  if (trainer.strategy().is_global_zero()) {
    fs::create_directories(root);
    fs::remove_all(tmp);  // left by a run that crashed mid-save
    fs::create_directories(tmp);
  }
  // Why: no rank may start writing into tmp while rank 0 may still be
  // clearing a stale copy of it.
  comm.barrier();
  if (options_.async_write()) {
    pending_ = trainer.start_async_checkpoint(tmp.string());
    CheckpointTiming timing;
    timing.step = step;
    timing.blocked_s = seconds_since(start);  // the snapshot; finish_pending adds the rest
    timing.async = true;
    timings_.push_back(timing);
    return;
  }
  try {
    write_checkpoint(trainer, tmp.string());
  } catch (const CheckpointWriteError& e) {
    fail_save(trainer, step, e);
  }
  publish(trainer, step);
  CheckpointTiming timing;
  timing.step = step;
  timing.blocked_s = timing.write_s = seconds_since(start);
  timings_.push_back(timing);
}

void ModelCheckpoint::finish_pending(Trainer& trainer) {
  const auto start = std::chrono::steady_clock::now();
  auto pending = std::move(pending_);
  CheckpointSaveStats stats;
  try {
    Comm job = trainer.strategy().job_comm();
    stats = pending->finish(job);
  } catch (const CheckpointWriteError& e) {
    fail_save(trainer, pending->step(), e);
  }
  publish(trainer, pending->step());
  for (auto& t : timings_) {
    if (t.step != pending->step() || !t.async) continue;
    t.finish_s = seconds_since(start);
    t.blocked_s += t.finish_s;
    t.write_s = stats.seconds;
  }
}

void ModelCheckpoint::fail_save(Trainer& trainer, int64_t step, const CheckpointWriteError& e) {
  // Every rank gets here alike (the save agreed on the failure, e.g. a full
  // disk): rank 0 frees the partial copy's space; published checkpoints
  // were never touched.
  if (trainer.strategy().is_global_zero()) {
    std::error_code ignored;
    fs::remove_all(tmp_dir(step), ignored);
  }
  // Sync point: no rank exits (and has the launcher stop the others)
  // before rank 0 has removed the partial copy.
  trainer.strategy().job_comm().barrier();
  const std::string newest = latest_checkpoint(options_.dirpath());
  TORCH_CHECK(false, "step ", step, ": ", e.what(), "; the newest complete checkpoint is ",
              newest.empty() ? std::string("none") : newest);
}

void ModelCheckpoint::publish(Trainer& trainer, int64_t step) {
  const fs::path root(options_.dirpath());
  const fs::path final_dir = root / checkpoint_dir_name(step);
  // Why: the rename publishes the checkpoint, so it must wait until every
  // rank has finished writing its part (a shard per rank under sharding).
  trainer.strategy().job_comm().barrier();
  if (trainer.strategy().is_global_zero()) {
    checkpoint_kill_point("before-rename", 0, step);  // test-only fault injection (trainer/checkpoint.h)
    // Replaces an earlier save of the same step (e.g. after a resume).
    publish_directory(tmp_dir(step).string(), final_dir.string());
    std::set<int64_t> keep;
    for (const auto& [score, best_step] : best_) keep.insert(best_step);
    prune_checkpoints(root.string(), options_.keep_last(), keep);
    if (!best_.empty()) {
      write_file_atomically((root / "best").string(), checkpoint_dir_name(best_.front().second) + "\n");
    }
  }
  last_checkpoint_ = final_dir.string();
  last_saved_step_ = step;
}

std::string ModelCheckpoint::state_dict() const {
  std::ostringstream out;
  out << "last_saved_step " << last_saved_step_ << "\n";
  char score[64];
  for (const auto& [value, step] : best_) {
    std::snprintf(score, sizeof(score), "%.17g", value);  // reads back as the same double
    out << "best " << score << " " << step << "\n";
  }
  return out.str();
}

void ModelCheckpoint::load_state_dict(const std::string& state) {
  std::istringstream in(state);
  std::string key;
  int64_t last = -1;
  in >> key >> last;
  TORCH_CHECK(in && key == "last_saved_step", "ModelCheckpoint: saved state '", state,
              "' does not start with 'last_saved_step <n>'");
  std::vector<std::pair<double, int64_t>> best;
  std::string score;
  int64_t step = -1;
  while (in >> key >> score >> step) {
    TORCH_CHECK(key == "best", "ModelCheckpoint: unexpected '", key, "' in saved state '", state, "'");
    best.emplace_back(std::stod(score), step);
  }
  last_saved_step_ = last;
  last_checkpoint_ = last >= 0 ? (fs::path(options_.dirpath()) / checkpoint_dir_name(last)).string() : "";
  // A resume may change the monitor or k: keep what still applies.
  best_.clear();
  if (!options_.monitor().empty()) {
    best_ = std::move(best);
    std::stable_sort(best_.begin(), best_.end(),
                     [&](const auto& a, const auto& b) { return better(options_.mode(), a.first, b.first); });
    if (static_cast<int64_t>(best_.size()) > options_.save_top_k()) best_.resize(options_.save_top_k());
  }
}

std::string checkpoint_dir_name(int64_t step) { return "step-" + std::to_string(step); }

int64_t checkpoint_step(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "step-5/"
  const std::string name = p.filename().string();
  const std::string digits = name.rfind("step-", 0) == 0 ? name.substr(5) : "";
  if (digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return -1;
  return std::stoll(digits);
}

std::vector<std::string> find_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    const int64_t step = checkpoint_step(entry.path().string());
    if (step >= 0) found.emplace_back(step, entry.path().string());
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

std::string newest_complete_checkpoint(const std::string& dir, std::vector<std::string>* skipped, bool verify_data) {
  const auto all = find_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string why = verify_data ? checkpoint_corrupt_reason(*it) : checkpoint_incomplete_reason(*it);
    if (why.empty()) return *it;
    if (skipped != nullptr) skipped->push_back(*it + ": " + why);
  }
  return "";
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep_last,
                                           const std::set<int64_t>& keep_steps) {
  auto all = find_checkpoints(dir);
  if (keep_last <= 0 || static_cast<int64_t>(all.size()) <= keep_last) return {};
  all.resize(all.size() - static_cast<size_t>(keep_last));  // the oldest ones
  std::vector<std::string> deleted;
  for (const auto& path : all) {
    if (keep_steps.count(checkpoint_step(path)) != 0) continue;
    fs::remove_all(path);
    deleted.push_back(path);
  }
  return deleted;
}

}  // namespace strata
