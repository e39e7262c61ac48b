#pragma once
// Pipeline schedules as data (issue 47, step 1): each rank's ordered list of
// actions over the micro-batches of one step, as torch.distributed.pipelining
// describes its schedules (an action list per rank) and Megatron runs them.
//
//   stage s of S = P·V lives on rank s mod P (V virtual stages per rank,
//   Megatron's looping placement: rank r holds stages r, r + P, ...)
//   F(s, m)  forward of micro-batch m through stage s
//   B(s, m)  its whole backward; or, split (zero bubble):
//   I(s, m)  the backward to the stage's input (what stage s − 1 waits for)
//   W(s, m)  the weights' gradients, which nothing downstream waits for
//
// simulate() runs the lists with given costs and gives every action's start
// and end, each rank's idle share (the bubble) and a text chart; it checks
// the schedule (every F and B once, nothing run before what it needs, no
// deadlock) and names what is wrong. with_communication() adds the sends and
// receives between stages on different ranks.
//
// Example:
//   auto s = strata::pp::make_schedule("1f1b", strata::pp::ScheduleOptions().ranks(4).microbatches(8));
//   auto t = strata::pp::simulate(*s);   // t.idle_share[r] == 3.0 / 11 for every rank
#include <torch/arg.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::pp {

enum class Op : uint8_t { Forward, Backward, BackwardInput, BackwardWeight, SendActivation, RecvActivation,
                          SendGrad, RecvGrad };

/// "F", "B", "I", "W", "SF", "RF", "SB", "RB".
std::string op_name(Op op);

struct Action {
  Op op = Op::Forward;
  int stage = 0;       ///< global stage, 0 .. stages − 1
  int microbatch = 0;
  int peer = -1;       ///< the other rank of a send or receive
  bool operator==(const Action&) const = default;
};
/// "F3@1" (op, micro-batch, stage); sends and receives add "->rank" / "<-rank".
std::string to_string(const Action& a);

struct ScheduleOptions {
  TORCH_ARG(int, ranks) = 2;           ///< pipeline ranks P
  TORCH_ARG(int, microbatches) = 2;    ///< M (the gradient-accumulation steps)
  TORCH_ARG(int, virtual_stages) = 1;  ///< V stages per rank (interleaved)
};

class Schedule {
 public:
  Schedule(std::string name, const ScheduleOptions& options, std::vector<std::vector<Action>> actions);
  const std::string& name() const { return name_; }
  const ScheduleOptions& options() const { return options_; }
  int ranks() const { return options_.ranks(); }
  int stages() const { return options_.ranks() * options_.virtual_stages(); }
  int rank_of(int stage) const { return stage % options_.ranks(); }
  /// Each rank's compute actions (F, B, I, W), in the order it runs them.
  const std::vector<std::vector<Action>>& actions() const { return actions_; }

 private:
  std::string name_;
  ScheduleOptions options_;
  std::vector<std::vector<Action>> actions_;
};

/// gpipe, 1f1b, interleaved-1f1b, zero-bubble (ZB-H1: 1F1B's memory, the
/// backward split so weight gradients fill the cool-down bubble).
std::vector<std::string> schedule_names();

/// The schedule `name` (or torchtitan's name for it: GPipe, 1F1B,
/// Interleaved1F1B, ZBH1); c10::ValueError naming the value and what is
/// allowed for an unknown name or sizes it cannot run.
std::unique_ptr<Schedule> make_schedule(const std::string& name, const ScheduleOptions& options);

/// Each rank's actions with the transfers between ranks: the receive right
/// before the action that needs it, the send right after the action that
/// made it (activations forward, input gradients backward).
std::vector<std::vector<Action>> with_communication(const Schedule& schedule);

/// The message a send or receive carries, the same number on both ends: its
/// stage boundary, micro-batch and direction (the executor's tag).
int message_of(const Action& transfer, int microbatches);

/// The lanes a pipeline's messages travel on, one communicator each (the
/// executor's PipelineLanes): activations or input gradients, to a higher or
/// a lower rank. On one lane two ranks exchange messages in one direction.
enum class Lane { kActivationUp = 0, kActivationDown, kGradUp, kGradDown };
inline constexpr int kLanes = 4;
/// The lane of `transfer`, a send or receive of rank `rank`.
Lane lane_of(const Action& transfer, int rank);

/// Why NCCL could deadlock on `lists` (with_communication's), "" when it
/// cannot. NCCL runs the point-to-point operations between two ranks on one
/// communicator in the order they are posted, and a send waits for its
/// receive: on every lane, the messages one rank sends another must be
/// posted in the order the other posts their receives (torch pairs them in
/// batch_isend_irecv's groups instead). Else the first lane, pair and
/// message where they differ.
std::string lane_order_problem(const std::vector<std::vector<Action>>& lists, int microbatches);

/// Per-stage compute times of one micro-batch for a whole model's share of a
/// rank (a virtual stage costs 1/V of them). backward = input + weight.
struct StageCosts {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;
};

struct Interval {
  Action action;
  double start = 0, end = 0;
};

struct Timeline {
  std::vector<std::vector<Interval>> ranks;
  double makespan = 0;
  std::vector<double> idle_share;  ///< per rank: 1 − busy / makespan
};

/// Runs the schedule with `costs` (transfers free): each action starts when
/// its rank is free and what it needs has ended. c10::ValueError naming the
/// action for a schedule that runs something twice, never, on another
/// rank's stage, or deadlocks (each rank's waiting action).
Timeline simulate(const Schedule& schedule, const StageCosts& costs = {});

/// Per rank, the most micro-batch activations it holds at once: forwards run
/// whose B (or I) has not (GPipe: M; 1F1B and ZB-H1: P − r; interleaved:
/// Megatron's warm-up + 1). A split backward's W keeps its layers' inputs a
/// little longer; that is not counted here.
std::vector<int> in_flight(const Schedule& schedule);

/// One line per rank: each time unit of `unit` as the action's letter and
/// micro-batch ("F0 F1 B0 ..."), '.' where the rank idles.
std::string render(const Timeline& timeline, double unit);

}  // namespace strata::pp
