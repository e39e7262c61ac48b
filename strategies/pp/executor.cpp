// run_pipeline_step (executor.h): a schedule's actions on one rank.
#include "strata/strategies/pp/executor.h"

#include <c10/util/Exception.h>

#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <limits>

namespace strata::pp {

namespace {

/// What a micro-batch's forward through one stage leaves for its backward.
struct Saved {
  torch::Tensor input;   ///< a leaf requiring grad (not on the first stage)
  torch::Tensor output;  ///< the activation, or the loss on the last stage
  torch::Tensor grad;    ///< the output's gradient, once the backward has it
};

class RankStep {
 public:
  RankStep(const Schedule& s, const std::map<int, Stage*>& stages, const StepInputs& in, PipelineLanes& lanes,
           int rank, const ExecutorOptions& o)
      : s_(s), stages_(stages), in_(in), lanes_(lanes), rank_(rank), o_(o) {}

  void run(const Action& a) {
    const auto start = std::chrono::steady_clock::now();
    dispatch(a);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    switch (a.op) {
      case Op::Forward: seconds_.forward += took; break;
      case Op::Backward: seconds_.backward += took; break;
      case Op::BackwardInput: seconds_.input += took; break;
      case Op::BackwardWeight: seconds_.weight += took; break;
      case Op::RecvActivation:
      case Op::RecvGrad: seconds_.waiting += took; break;
      default: break;  // sends are posted, not waited
    }
  }

  const StepSeconds& seconds() const { return seconds_; }

  /// Every send waited: a rank leaves the step only once its peers have what it sent.
  std::vector<double> finish() {
    for (auto& w : sends_) w.wait();
    // Every micro-batch's state was released at its last use.
    TORCH_CHECK(saved_.empty() && received_.empty(), "pipeline: ", saved_.size(), " stage states and ",
                received_.size(), " received activations left after the step");
    std::vector<double> out;
    for (const auto& [k, loss] : losses_) out.push_back(loss);
    return out;
  }

 private:
  void dispatch(const Action& a) {
    switch (a.op) {
      case Op::RecvActivation: received_[key(a)] = recv(a); break;
      case Op::Forward: forward(a); break;
      case Op::SendActivation: send(saved_.at(key(a)).output.detach(), a); break;
      case Op::RecvGrad: saved_.at(key(a)).grad = recv(a); break;
      case Op::Backward: backward(a, /*inputs=*/true, /*weights=*/true); break;
      case Op::BackwardInput: backward(a, true, false); break;
      case Op::BackwardWeight: backward(a, false, true); break;
      case Op::SendGrad: send_grad(a); break;
    }
  }

  static std::pair<int, int> key(const Action& a) { return {a.stage, a.microbatch}; }
  bool last(int stage) const { return stage + 1 == s_.stages(); }

  /// A tag per (stage boundary, micro-batch, direction): on Gloo, messages
  /// of one pair of ranks never match the wrong receive whatever order they
  /// are posted in (NCCL ignores tags: the lanes keep its order).
  int tag(const Action& a) const { return message_of(a, s_.options().microbatches()); }

  torch::Tensor recv(const Action& a) {
    Comm& lane = lanes_.of(a);
    auto buffer = torch::empty(o_.activation_shape(), torch::TensorOptions().dtype(o_.dtype()).device(lane.device()));
    // Waited here: the schedule puts the receive right before the action that needs it.
    lane.recv_async(buffer, a.peer, tag(a)).wait();
    return buffer;
  }

  void send(const torch::Tensor& t, const Action& a) {
    TORCH_CHECK(t.defined(), "pipeline: nothing to send for ", to_string(a));
    sends_.push_back(lanes_.of(a).send_async(t.to(o_.dtype()).contiguous(), a.peer, tag(a)));
  }

  /// The input's gradient to the previous stage's rank; the input itself is
  /// then of no more use here (a later W needs only the graph).
  void send_grad(const Action& a) {
    Saved& saved = saved_.at(key(a));
    send(saved.input.grad(), a);
    saved.input = torch::Tensor();
    release_if_done(a);
  }

  /// A micro-batch's state at a stage goes once its backward is whole and no
  /// gradient is left to send: the activations a rank holds are then the
  /// schedule's in-flight ones (in_flight()), not every micro-batch's.
  void release_if_done(const Action& a) {
    const Saved& saved = saved_.at(key(a));
    const bool to_send = saved.input.defined() && s_.rank_of(a.stage - 1) != rank_;
    if (!saved.output.defined() && !to_send) saved_.erase(key(a));
  }

  Stage& stage(int s) const {
    const auto it = stages_.find(s);
    TORCH_CHECK_VALUE(it != stages_.end(), "pipeline: rank ", rank_, " runs stage ", s, " but holds no such stage");
    return *it->second;
  }

  void forward(const Action& a) {
    Saved saved;
    if (a.stage == 0) {
      saved.output = stage(0).forward(in_.inputs.at(size_t(a.microbatch)), {});
    } else {
      // From the rank before, or in memory from this rank's previous stage.
      const auto it = received_.find(key(a));
      saved.input = (it != received_.end() ? it->second : saved_.at({a.stage - 1, a.microbatch}).output.detach())
                        .requires_grad_(true);
      if (it != received_.end()) received_.erase(it);
      const torch::Tensor target = last(a.stage) ? in_.targets.at(size_t(a.microbatch)) : torch::Tensor();
      saved.output = stage(a.stage).forward(saved.input, target);
    }
    if (last(a.stage)) {
      // (The dry run's meta tensors have no value.)
      losses_[a.microbatch] = saved.output.is_meta() ? 0.0 : saved.output.item<double>();
      if (o_.on_loss()) o_.on_loss()(saved.output);
      // The step's loss is the mean over micro-batches (times the loss scale).
      saved.grad = torch::full_like(saved.output, o_.loss_scale() / s_.options().microbatches());
    }
    saved_[key(a)] = std::move(saved);
  }

  /// B: both; I: the gradient of the stage's input only (what the previous
  /// stage waits for); W: the parameters' (accumulated). Split, each walks
  /// the stage's graph: the graph is kept for W.
  void backward(const Action& a, bool inputs, bool weights) {
    Saved& saved = saved_.at(key(a));
    TORCH_CHECK(saved.grad.defined(), "pipeline: ", to_string(a), " before its output's gradient arrived");
    const bool has_input = saved.input.defined();
    if (inputs && weights) {
      torch::autograd::backward({saved.output}, {saved.grad});
    } else if (inputs) {
      // The graph stays for W.
      if (has_input) {
        auto g = torch::autograd::grad({saved.output}, {saved.input}, {saved.grad}, /*retain_graph=*/true);
        saved.input.mutable_grad() = g[0];
      }
    } else {
      const auto params = stage(a.stage).parameters();
      torch::autograd::backward({saved.output}, {saved.grad}, /*retain_graph=*/false, /*create_graph=*/false,
                                params);
    }
    // The previous stage on this same rank takes the input's gradient in memory.
    if (inputs && has_input && s_.rank_of(a.stage - 1) == rank_)
      saved_.at({a.stage - 1, a.microbatch}).grad = saved.input.grad();
    // The backward is whole: only a gradient to send may be left.
    if (weights) {
      saved.output = torch::Tensor();
      release_if_done(a);
      // This rank's last backward of the micro-batch: its first held stage's.
      if (a.stage == stages_.begin()->first && o_.on_backward_done()) o_.on_backward_done()();
    }
  }

  const Schedule& s_;
  const std::map<int, Stage*>& stages_;
  const StepInputs& in_;
  PipelineLanes& lanes_;
  const int rank_;
  const ExecutorOptions& o_;
  std::map<std::pair<int, int>, torch::Tensor> received_;
  std::map<std::pair<int, int>, Saved> saved_;
  std::map<int, double> losses_;
  std::vector<PendingWork> sends_;
  StepSeconds seconds_;
};

}  // namespace

PipelineLanes PipelineLanes::split(const Comm& pp) {
  std::vector<int> all(size_t(pp.size()));
  for (int r = 0; r < pp.size(); ++r) all[size_t(r)] = r;
  std::vector<Comm> lanes;
  // Collective: every rank makes the same four splits in the same order.
  for (const char* name : {"act-up", "act-down", "grad-up", "grad-down"}) {
    lanes.push_back(pp.split(pp.group_name() + "-" + name, {all}));
  }
  return PipelineLanes(std::move(lanes));
}

PipelineLanes::PipelineLanes(const Comm& one) : lanes_(size_t(kLanes), one) {}

Comm& PipelineLanes::of(const Action& transfer) {
  return lanes_[size_t(lane_of(transfer, lanes_.front().rank()))];
}

std::vector<double> run_pipeline_step(const Schedule& schedule, const std::map<int, Stage*>& stages,
                                      const StepInputs& in, PipelineLanes& lanes, const ExecutorOptions& options,
                                      StepSeconds* seconds) {
  Comm& comm = lanes[Lane::kActivationUp];
  TORCH_CHECK_VALUE(comm.size() == schedule.ranks(), "pipeline: a ", schedule.ranks(), "-rank schedule on ",
                    comm.size(), " ranks");
  for (const auto& [s, stage] : stages) {
    TORCH_CHECK_VALUE(stage != nullptr && schedule.rank_of(s) == comm.rank(), "pipeline: rank ", comm.rank(),
                      " was given stage ", s, ", which the schedule places on rank ", schedule.rank_of(s));
  }
  const auto start = std::chrono::steady_clock::now();
  RankStep step(schedule, stages, in, lanes, comm.rank(), options);
  const auto lists = with_communication(schedule);
  for (const Action& a : lists[size_t(comm.rank())]) step.run(a);
  auto losses = step.finish();
  if (seconds != nullptr) {
    StepSeconds mine = step.seconds();
    mine.total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *seconds += mine;
  }
  return losses;
}

std::vector<double> run_pipeline_step(const Schedule& schedule, const std::map<int, Stage*>& stages,
                                      const StepInputs& in, Comm& comm, const ExecutorOptions& options,
                                      StepSeconds* seconds) {
  PipelineLanes one(comm);
  return run_pipeline_step(schedule, stages, in, one, options, seconds);
}

StepSeconds& StepSeconds::operator+=(const StepSeconds& o) {
  forward += o.forward;
  backward += o.backward;
  input += o.input;
  weight += o.weight;
  waiting += o.waiting;
  total += o.total;
  return *this;
}

torch::Tensor swap_with_peer(const torch::Tensor& mine, int peer, PipelineLanes& lanes) {
  const torch::Tensor out = mine.contiguous();
  torch::Tensor theirs = torch::empty_like(out);
  Comm& up = lanes[Lane::kGradUp];
  Comm& down = lanes[Lane::kGradDown];
  const bool higher = peer > up.rank();
  // A tag no activation or gradient of a step uses.
  constexpr int kTiedTag = std::numeric_limits<int>::max();
  // Sync point: each direction on its own lane (after the step's gradients
  // there, all waited), so on NCCL neither send waits behind the other.
  auto sent = (higher ? up : down).send_async(out, peer, kTiedTag);
  (higher ? down : up).recv_async(theirs, peer, kTiedTag).wait();
  sent.wait();
  return theirs;
}

torch::Tensor swap_with_peer(const torch::Tensor& mine, int peer, Comm& comm) {
  PipelineLanes one(comm);
  return swap_with_peer(mine, peer, one);
}

void exchange_tied_gradient(const torch::Tensor& weight, int first_rank, int last_rank, Comm& comm) {
  const int me = comm.rank();
  if (first_rank == last_rank || (me != first_rank && me != last_rank)) return;
  // One stage may not have used the weight this step: its gradient is zero.
  const torch::Tensor mine = weight.grad().defined() ? weight.grad() : torch::zeros_like(weight);
  const torch::Tensor theirs = swap_with_peer(mine, me == first_rank ? last_rank : first_rank, comm);
  // In place where a gradient exists: a strategy may hold it as a view of its
  // own buffer (ddp's buckets), which a new tensor would leave stale.
  if (weight.grad().defined()) {
    weight.mutable_grad().add_(theirs);
  } else {
    weight.mutable_grad() = theirs;
  }
}

}  // namespace strata::pp
