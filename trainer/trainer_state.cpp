// The Trainer's part of a checkpoint: saving (with every callback's and the
// generators' state) and putting back what a resume needs -- the data
// position, the step limit, the world size, each rank's generators.
#include "strata/trainer/trainer.h"

#include "strata/trainer/checkpoint.h"
#include "strata/trainer/lr_schedule.h"
#include "strata/trainer/resume_state.h"

#include <chrono>
#include <iostream>

namespace strata {

namespace {
// CheckpointMeta::state keys of the trainer's own part.
const char* const kWorldSizeKey = "trainer/world_size";
const char* const kSamplesKey = "trainer/samples_seen";
const char* const kMaxStepsKey = "trainer/max_steps";
const char* const kLossScalerKey = "trainer/loss_scaler";
std::string rng_key(int rank) { return "trainer/rng/rank" + std::to_string(rank); }

int64_t parse_count(const std::map<std::string, std::string>& state, const std::string& key,
                    const std::string& dir) {
  const auto& text = state.at(key);
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
  }
  TORCH_CHECK(used == text.size() && value >= 0, "checkpoint '", dir, "': ", key, " is '", text,
              "', not a count");
  return value;
}

}  // namespace

CheckpointSaveStats Trainer::save_checkpoint(const std::string& dir, const std::string& format) {
  const auto stats = strata::save_checkpoint(dir, *strategy_, *optimizer_, checkpoint_meta(format));
  each_callback([&](Callback& cb) { cb.on_save_checkpoint(*this, dir); });
  return stats;
}

std::unique_ptr<AsyncCheckpointSave> Trainer::start_async_checkpoint(const std::string& dir) {
  auto save = std::make_unique<AsyncCheckpointSave>(dir, *strategy_, *optimizer_, checkpoint_meta("sharded"));
  each_callback([&](Callback& cb) { cb.on_save_checkpoint(*this, dir); });
  return save;
}

CheckpointMeta Trainer::checkpoint_meta(const std::string& format) {
  TORCH_CHECK(module_ != nullptr && optimizer_ != nullptr,
              "save_checkpoint needs a running fit() (no module/optimizer yet)");
  CheckpointMeta meta;
  meta.step = step_;
  meta.world_size = strategy_->world_size();
  meta.strategy = strategy_->name();
  meta.optimizer = options_.optimizer();
  meta.format = format.empty() ? options_.checkpoint_format() : format;
  if (meta.format.empty()) meta.format = strategy_->optimizer_sharded() ? "sharded" : "full";
  meta.state = trainer_state();
  const auto keys = callback_state_keys();
  for (size_t i = 0; i < callbacks_.size(); ++i) {
    if (auto blob = callbacks_[i]->state_dict(); !blob.empty()) meta.state[keys[i]] = std::move(blob);
  }
  return meta;
}

std::vector<std::string> Trainer::callback_state_keys() const {
  std::vector<std::string> keys;
  std::map<std::string, int> seen;
  for (const auto& cb : callbacks_) {
    const int n = ++seen[cb->name()];
    keys.push_back("callback/" + cb->name() + (n > 1 ? "#" + std::to_string(n) : ""));
  }
  return keys;
}

std::map<std::string, std::string> Trainer::trainer_state() {
  const int n = strategy_->world_size();
  const auto mine = capture_rng_state(strategy_->device()).to(strategy_->device());
  auto all = torch::empty({n * mine.numel()}, mine.options());
  // Sync point: rank 0 writes the checkpoint's metadata alone, so it needs every rank's
  // generator state (the same length on every rank: same build and device).
  strategy_->comm().all_gather_into(all, mine);
  all = all.cpu();
  std::map<std::string, std::string> state;
  state[kWorldSizeKey] = std::to_string(n);
  // In samples, not micro-batches: a world of another size (or batch size)
  // with the same global batch continues at the same sample.
  state[kSamplesKey] = std::to_string(micro_batch_ * options_.batch_size() * n);
  state[kMaxStepsKey] = std::to_string(options_.max_steps());
  for (int r = 0; r < n; ++r) state[rng_key(r)] = bytes_of(all.narrow(0, r * mine.numel(), mine.numel()));
  // The same on every rank (each update follows the global norm): rank 0's.
  if (scaler_) state[kLossScalerKey] = scaler_->state_dict();
  return state;
}

void Trainer::restore_loss_scaler(const std::map<std::string, std::string>& state) {
  if (!scaler_) return;
  if (const auto it = state.find(kLossScalerKey); it != state.end()) {
    const auto note = scaler_->load_state_dict(it->second, "checkpoint '" + options_.resume_from() + "'");
    if (!note.empty() && strategy_->is_global_zero()) std::cerr << "note: " << note << std::endl;
  } else if (strategy_->is_global_zero()) {
    std::cerr << "note: checkpoint '" << options_.resume_from() << "' holds no loss scaler state (it was not "
              << "trained with --precision 16-mixed): the loss scale starts at " << scaler_->scale() << std::endl;
  }
}

std::string resume_position_problem(const std::map<std::string, std::string>& state, const std::string& dir,
                                    int64_t batch_size, int world_size) {
  if (state.count(kSamplesKey) == 0) return "";  // before the data position was saved: step-aligned
  const int64_t samples = parse_count(state, kSamplesKey, dir);
  if (samples % (batch_size * world_size) == 0) return "";
  return c10::str("checkpoint '", dir, "' stopped after ", samples,
                  " training samples, which is not a whole number of micro-batches of batch_size ", batch_size, " x ",
                  world_size, " rank(s); resume with a global micro-batch that divides it");
}

void Trainer::restore_trainer_state(const std::map<std::string, std::string>& state) {
  const std::string& dir = options_.resume_from();
  const int n = strategy_->world_size();
  const bool zero = strategy_->is_global_zero();
  const int64_t per_micro_batch = options_.batch_size() * n;
  if (state.count(kSamplesKey) == 0) {
    // A checkpoint from before the data position was saved: step-aligned.
    micro_batch_ = step_ * options_.accumulate_grad_batches();
  } else {
    const std::string problem = resume_position_problem(state, dir, options_.batch_size(), n);
    TORCH_CHECK_VALUE(problem.empty(), problem);
    micro_batch_ = parse_count(state, kSamplesKey, dir) / per_micro_batch;
  }
  if (state.count(kMaxStepsKey) != 0 && zero) {
    const int64_t saved_max = parse_count(state, kMaxStepsKey, dir);
    const auto before = lr_schedule_of(options_, saved_max);
    const auto now = lr_schedule_of(options_, options_.max_steps());
    int64_t first_change = -1;
    for (int64_t s = 0; s < step_ && first_change < 0; ++s) {
      if (before(s) != now(s)) first_change = s;
    }
    if (first_change >= 0) {
      std::cerr << "note: the checkpoint's run had max_steps " << saved_max << ", this one has "
                << options_.max_steps() << ": its steps " << first_change + 1 << ".." << step_
                << " followed that run's cosine decay, so this run is not the same as an "
                << "uninterrupted " << options_.max_steps() << "-step run" << std::endl;
    }
  }
}

void Trainer::restore_rng(const std::map<std::string, std::string>& state) {
  const std::string& dir = options_.resume_from();
  const int n = strategy_->world_size();
  const int rank = strategy_->rank();
  const bool zero = strategy_->is_global_zero();
  const int saved_world = state.count(kWorldSizeKey) ? static_cast<int>(parse_count(state, kWorldSizeKey, dir)) : -1;
  const auto mine = state.find(rng_key(rank));
  if (saved_world == n && mine != state.end()) {
    restore_rng_state(tensor_of(mine->second), strategy_->device());
  } else {
    seed_rng(resume_seed(options_.seed(), step_, rank), strategy_->device());
    if (zero) {
      std::cerr << "note: checkpoint '" << dir << "' was written by "
                << (saved_world > 0 ? std::to_string(saved_world) : std::string("an unknown number of"))
                << " rank(s), this run has " << n << ": random generators re-seeded from (seed "
                << options_.seed() << ", step " << step_ << ", rank), so dropout masks differ from the "
                << "uninterrupted run" << std::endl;
    }
  }
}

}  // namespace strata
