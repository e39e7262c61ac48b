#include "strata/callbacks/profiler.h"

#include "strata/trainer/trainer.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>

namespace strata {
namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

namespace {

std::set<impl::ActivityType> activities() {
  std::set<impl::ActivityType> out{impl::ActivityType::CPU};
  if (torch::cuda::is_available()) out.insert(impl::ActivityType::CUDA);
  return out;
}

}  // namespace

Profiler::Profiler(ProfilerOptions options) : options_(std::move(options)) {
  TORCH_CHECK_VALUE(!options_.dir().empty(), "Profiler: dir must not be empty");
  TORCH_CHECK_VALUE(options_.skip() >= 0, "Profiler: skip must be >= 0, got ", options_.skip());
  TORCH_CHECK_VALUE(options_.steps() >= 1, "Profiler: steps must be >= 1, got ", options_.steps());
}

Profiler::~Profiler() {
  // A run that threw past on_exception: leave no profiler enabled behind.
  if (active_) prof::disableProfiler();
}

std::string Profiler::trace_path(int rank) const {
  return (std::filesystem::path(options_.dir()) / ("trace-rank" + std::to_string(rank) + ".json")).string();
}

void Profiler::on_train_batch_start(Trainer&, TrainingModule&, int64_t step) {
  if (active_ || done_ || step != options_.skip() + 1) return;
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
                                    /*profile_memory=*/false, /*with_stack=*/false);
  prof::prepareProfiler(config, activities());
  prof::enableProfiler(config, activities());
  active_ = true;
}

void Profiler::on_train_step_end(Trainer& trainer, TrainingModule&, int64_t step) {
  if (active_ && step >= options_.skip() + options_.steps()) stop_and_save(trainer.strategy().job_comm().rank());
}

void Profiler::on_fit_end(Trainer& trainer, TrainingModule&) {
  if (active_) stop_and_save(trainer.strategy().job_comm().rank());
}

void Profiler::on_exception(Trainer&, TrainingModule&, const std::exception&) {
  if (active_) prof::disableProfiler();  // nothing worth saving from a failed step
  active_ = false;
}

void Profiler::stop_and_save(int rank) {
  auto result = prof::disableProfiler();
  active_ = false;
  done_ = true;
  std::filesystem::create_directories(options_.dir());
  result->save(trace_path(rank));
}

}  // namespace strata
