// --resume's checks (phase 1, run_checks.h): which checkpoint --resume last
// and --resume auto mean, whether one exists with steps left to train, and
// whether it matches the model.
#include "strata/recipes/app/run_checks.h"

#include "strata/callbacks/model_checkpoint.h"
#include "strata/trainer/checkpoint.h"
#include "strata/trainer/trainer.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace strata::recipes {

namespace fs = std::filesystem;

void check_resume_matches(const std::string& dir, torch::nn::Module& model, const std::string& optimizer) {
  std::map<std::string, std::vector<int64_t>> tensors;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) tensors[item.key()] = item.value().sizes().vec();
  for (const auto& item : model.named_buffers(/*recurse=*/true)) tensors[item.key()] = item.value().sizes().vec();
  try {
    check_checkpoint_model(dir, tensors, optimizer);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "--resume: ", e.what_without_backtrace());
  }
}

std::string checkpoints_dir(const RunConfig& config) {
  return (fs::path(config.output_dir) / "checkpoints").string();
}

namespace {

/// --resume auto: the same command for a job's first start and every restart.
std::string resolve_resume_auto(const RunConfig& config, std::vector<std::string>* notes) {
  std::vector<std::string> skipped;
  // Every block checked: a restart after bit rot falls back to the checkpoint
  // before, saying so, instead of failing its load on every restart. The
  // price is one more read of the checkpoint it resumes, per process.
  const std::string dir = newest_complete_checkpoint(checkpoints_dir(config), &skipped, /*verify_data=*/true);
  auto say = [notes](const std::string& line) {
    if (notes != nullptr) notes->push_back(line);
  };
  for (const auto& s : skipped) say("--resume auto: skipping an incomplete or corrupt checkpoint: " + s);
  if (!dir.empty()) {
    say(c10::str("--resume auto: resuming from '", dir, "' (step ", checkpoint_step(dir), ")"));
    return dir;
  }
  // No checkpoint. A first start, or a restart of an attempt that died before
  // its first checkpoint (its partial metrics.csv is rewritten); but a run
  // that finished (it wrote summary.json) without checkpoints is a result.
  const fs::path summary = fs::path(config.output_dir) / "summary.json";
  std::error_code ec;
  TORCH_CHECK_VALUE(!fs::exists(summary, ec), "--resume auto: '", config.output_dir,
                    "' holds a finished run (summary.json) and no complete checkpoint to resume; starting fresh "
                    "would overwrite its outputs: use another --output-dir");
  say(c10::str("--resume auto: no complete checkpoint in '", checkpoints_dir(config), "': starting fresh"));
  return "";
}

}  // namespace

std::string resolve_resume(const RunConfig& config, std::vector<std::string>* notes) {
  std::string dir = config.resume;
  if (dir.empty()) return dir;
  if (dir == "auto") {
    dir = resolve_resume_auto(config, notes);
    if (dir.empty()) return dir;
  } else if (dir == "last") {
    dir = latest_checkpoint(checkpoints_dir(config));
    TORCH_CHECK_VALUE(!dir.empty(), "--resume last: no checkpoint (step-<N> directory) in '",
                      checkpoints_dir(config), "'");
  }
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::is_directory(dir, ec), "--resume '", config.resume, "': '", dir, "' is not a directory");
  // A ModelCheckpoint directory names its step: a resume with nothing left to
  // train is bad input (the Trainer checks the step inside any checkpoint too).
  const int64_t step = checkpoint_step(dir);
  TORCH_CHECK_VALUE(step < config.max_steps || config.eval_only, "--resume '", config.resume, "': checkpoint '", dir,
                    "' is at step ", step, ", not below --max-steps ", config.max_steps,
                    "; nothing left to train (raise --max-steps)");
  return dir;
}

void check_resume_position(const RunConfig& config, int data_ranks) {
  if (config.resume.empty()) return;
  CheckpointMeta meta;
  try {
    meta = read_checkpoint_meta(config.resume);
  } catch (const c10::Error&) {
    return;  // not a checkpoint: check_model_inputs names what is wrong with it
  }
  const std::string problem = resume_position_problem(meta.state, config.resume, config.batch_size, data_ranks);
  TORCH_CHECK_VALUE(problem.empty(), "--resume: ", problem);
}

}  // namespace strata::recipes
