#include "strata/recipes/app/testing_aids.h"

#include "strata/trainer/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>

namespace strata::recipes {

void FailAtStep::on_train_batch_start(Trainer& trainer, TrainingModule&, int64_t step) {
  TORCH_CHECK(!(step == step_ && trainer.strategy().rank() == rank_), "injected failure at step ", step, " on rank ",
              rank_, " (STRATA_TEST_FAIL_AT_STEP)");
}

void KillAtStep::on_train_batch_start(Trainer& trainer, TrainingModule&, int64_t step) {
  if (step != step_ || trainer.strategy().rank() != rank_) return;
  if (!once_file_.empty()) {
    // O_EXCL: of any processes racing here, one creates the marker and dies.
    const int fd = ::open(once_file_.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return;  // an earlier attempt was killed here already
    ::close(fd);
  }
  std::cerr << "[rank " << rank_ << "] STRATA_TEST_KILL_AT_STEP: SIGKILL at step " << step << std::endl;
  std::raise(SIGKILL);
}

void apply_skip_collective_aid(Comm& comm) {
  const char* seq = std::getenv("STRATA_TEST_SKIP_COLLECTIVE");
  if (seq == nullptr) return;
  const char* rank = std::getenv("STRATA_TEST_SKIP_RANK");
  if (comm.rank() != (rank ? std::atoi(rank) : 0)) return;
  std::cerr << "[rank " << comm.rank() << "] STRATA_TEST_SKIP_COLLECTIVE: collective #" << seq
            << " of the world will not be issued" << std::endl;
  comm.skip_collective_for_testing(std::atoll(seq));
}

void OverflowAtStep::on_before_backward(Trainer& trainer, TrainingModule&, const torch::Tensor& loss) {
  const auto& strategy = trainer.strategy();
  if (trainer.global_step() + 1 != step_ || strategy.rank() != strategy.world_size() - 1) return;
  loss.register_hook([](const torch::Tensor& grad) { return grad * 1e6; });
}

}  // namespace strata::recipes
