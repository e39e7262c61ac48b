#include "strata/strategies/fake_world.h"

#include <c10/util/Exception.h>

namespace strata {

namespace {

/// Done when made: wait() returns at once, the outputs are left as they are.
class DoneWork : public c10d::Work {
 public:
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
};

c10::intrusive_ptr<c10d::Work> done() { return c10::make_intrusive<DoneWork>(); }

// Overrides every collective Comm issues to a group that is not Gloo (the
// flat all-gather and reduce-scatter under the names both supported
// LibTorch versions have; 2.15 deprecates them, hence the pragma).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
class FakeProcessGroup : public c10d::ProcessGroup {
 public:
  FakeProcessGroup(int rank, int size) : c10d::ProcessGroup(rank, size) {}
  const std::string getBackendName() const override { return "fake"; }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>&, const c10d::ReduceOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor&, at::Tensor&, const c10d::AllgatherOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor&, at::Tensor&,
                                                      const c10d::ReduceScatterOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&,
                                               std::vector<int64_t>&, const c10d::AllToAllOptions&) override {
    return done();
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return done(); }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override { return done(); }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override { return done(); }
};
#pragma GCC diagnostic pop

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> fake_process_group(int rank, int size) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "fake_process_group: rank ", rank, " outside [0, ", size, ")");
  return c10::make_intrusive<FakeProcessGroup>(rank, size);
}

SubgroupFactory fake_subgroup_factory() {
  return [](const std::string&, int rank, int size) { return fake_process_group(rank, size); };
}

}  // namespace strata
