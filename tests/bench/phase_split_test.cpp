// phase_split_test - bench/phase_split.h: where a step's time goes, from a
// synthetic trace with known answers and from real traces that strata-gpt
// --profile and PyTorch's torch.profiler wrote (tests/fixtures/traces).
#include "strata/bench/harness.h"
#include "strata/bench/phase_split.h"
#include "strata/bench/report.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>

namespace {

using namespace strata::bench;

nlohmann::json op(const std::string& name, double ts, double dur, int tid = 1, const std::string& cat = "cpu_op") {
  return {{"ph", "X"}, {"cat", cat}, {"name", name}, {"pid", 7}, {"tid", tid}, {"ts", ts}, {"dur", dur}};
}

double sum_of(const PhaseSplit& s) {
  double total = 0.0;
  for (const auto& [phase, ms] : s.ms_per_step) total += ms;
  return total;
}

TEST(PhaseSplitTest, EveryMicrosecondOfTheMainThreadGoesToOnePhase) {
  // Two steps on thread 1 (330 us), a busy-looking but shorter thread 2, and
  // a GPU kernel that is not a CPU op.
  nlohmann::json events = nlohmann::json::array({
      op("aten::linear", 0, 100),  // own 20 us: GEMM
      op("aten::addmm", 10, 80),   // own 75 us: GEMM
      op("aten::empty", 10, 5),    // allocation
      op("autograd::engine::evaluate_function: torch::autograd::CppNode<strata::CausalAttentionFunction>", 100,
         100),                     // attention, whole
      op("aten::mm", 110, 40),     // inside attention: not a GEMM
      // 200-210: outside ops
      op("strata::optimizer_step", 210, 90),  // optimizer, whole
      op("aten::add_", 220, 60),
      op("aten::gelu", 300, 20),        // element-wise
      op("strata::comm_wait", 320, 10),  // comm & I/O wait
      op("FSDP::pre_forward", 330, 20, 1, "user_annotation"),  // own 15 us: outside ops
      op("aten::copy_", 335, 5),                                // element-wise
      op("aten::mm", 0, 200, 2),         // thread 2: less op time than thread 1
      op("aten::mm", 50, 1000, 1, "kernel"),
  });
  const PhaseSplit s = phase_split({{"traceEvents", events}}, 2);
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.step_ms, 0.350 / 2);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("GEMM"), 0.095 / 2);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("allocation"), 0.005 / 2);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("attention"), 0.100 / 2);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("optimizer"), 0.090 / 2);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("element-wise & other ops"), 0.025 / 2);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("comm & I/O wait"), 0.010 / 2);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("outside ops"), 0.025 / 2);
  EXPECT_NEAR(sum_of(s), s.step_ms, 1e-12);
  EXPECT_EQ(s.ms_per_step.size(), phase_names().size());

  const PhaseSplit back = PhaseSplit::from_json(s.to_json());
  EXPECT_EQ(back.ms_per_step, s.ms_per_step);
  EXPECT_DOUBLE_EQ(back.step_ms, s.step_ms);
}

TEST(PhaseSplitTest, AChildOverhangingItsParentDoesNotSwallowTheNextSibling) {
  // Timestamps rounded apart: addmm ends 1 us after its linear.
  const PhaseSplit s = phase_split({{"traceEvents", {op("aten::linear", 0, 100), op("aten::addmm", 10, 91),
                                                     op("aten::gelu", 100, 20)}}},
                                   1);
  EXPECT_DOUBLE_EQ(s.step_ms, 0.120);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("GEMM"), 0.100);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("element-wise & other ops"), 0.020);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("outside ops"), 0.0);
}

TEST(PhaseSplitTest, ScopesOwnTimeIsOutsideOpsButACompiledRegionsIsItsFusedKernels) {
  const PhaseSplit s = phase_split(
      {{"traceEvents",
        {op("strata::fsdp_gather", 0, 10), op("aten::copy_", 2, 4),  // strata's span: own 6 us outside ops
         op("FSDP::pre_forward", 10, 10, 1, "user_annotation"), op("aten::copy_", 12, 4),
         op("Torch-Compiled Region: 0/0", 20, 30, 1, "user_annotation"),  // own 20 us: Inductor's kernels
         op("## Call CompiledFxGraph fabc ##", 22, 20, 1, "user_annotation"), op("aten::mm", 25, 10)}}},
      1);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("outside ops"), 0.012);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("element-wise & other ops"), 0.028);
  EXPECT_DOUBLE_EQ(s.ms_per_step.at("GEMM"), 0.010);
  EXPECT_NEAR(sum_of(s), s.step_ms, 1e-12);
}

TEST(PhaseSplitTest, NamesFromBothProgramsMapToTheirPhases) {
  EXPECT_EQ(phase_of("aten::_scaled_dot_product_flash_attention_for_cpu").phase, "attention");
  EXPECT_EQ(phase_of("Optimizer.step#AdamW.step").phase, "optimizer");
  EXPECT_TRUE(phase_of("Optimizer.step#AdamW.step").encloses);
  EXPECT_EQ(phase_of("strata::offload_read").phase, "comm & I/O wait");
  EXPECT_EQ(phase_of("FSDP::post_backward_rs_wait ()").phase, "comm & I/O wait");
  EXPECT_EQ(phase_of("aten::bmm").phase, "GEMM");
  EXPECT_FALSE(phase_of("aten::bmm").encloses);
  EXPECT_EQ(phase_of("aten::empty_strided").phase, "allocation");
  EXPECT_EQ(phase_of("aten::_to_copy").phase, "element-wise & other ops");
}

TEST(PhaseSplitTest, RealTracesOfStrataAndPyTorchSplitWhole) {
  // gpt_peer.py's tiny GPT (SDPA, fused AdamW; FSDP2, and torch.compile'd on one
  // process) and strata-gpt's, 3 traced steps each.
  for (const char* file : {"strata-gpt-fsdp-rank0.json", "pytorch-fsdp2-rank0.json", "pytorch-compiled-rank0.json"}) {
    SCOPED_TRACE(file);
    const PhaseSplit s = phase_split_file(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/traces/" + file, 3);
    EXPECT_GT(s.step_ms, 0.0);
    EXPECT_NEAR(sum_of(s), s.step_ms, 1e-9 * s.step_ms);
    for (const char* phase : {"GEMM", "attention", "optimizer", "element-wise & other ops"}) {
      EXPECT_GT(s.ms_per_step.at(phase), 0.0) << phase;
    }
  }
}

TEST(PhaseSplitTest, NotATraceIsAnErrorNamingTheFile) {
  EXPECT_THROW(phase_split(nlohmann::json::object(), 3), c10::ValueError);
  EXPECT_THROW(phase_split({{"traceEvents", nlohmann::json::array()}}, 3), c10::ValueError);
  try {
    phase_split_file("/no/such/trace.json", 3);
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/trace.json"), std::string::npos) << e.what();
  }
}

TEST(PhaseSplitTest, TheProfiledRunGivesTheSplitAndNoTimingFigure) {
  BenchCase c;
  c.name = "peer/gpt-mini/single-1x2-fp32/strata";
  c.phase_split = true;
  const nlohmann::json summary = {{"world_size", 1},
                                  {"parameters", 1000},
                                  {"steps", 10},
                                  {"tokens_per_s", 100.0},
                                  {"peak_tensor_bytes", {20}},
                                  {"model_state_bytes", {{{"params", 4000}, {"grads", 4000}, {"optimizer", 8000}}}},
                                  {"comm_bytes_rank0", nlohmann::json::object()}};
  CaseRun timed;
  timed.bench_case = &c;
  timed.summary = summary;
  CaseRun profiled;
  profiled.bench_case = &c;
  profiled.profiled = true;
  profiled.summary = summary;
  profiled.summary["tokens_per_s"] = 1.0;  // slowed by the profiler: must not count
  PhaseSplit split;
  split.steps = 3;
  split.step_ms = 2.0;
  for (const auto& name : phase_names()) split.ms_per_step[name] = 2.0 / double(phase_names().size());
  profiled.summary["phase_split"] = split.to_json();
  const auto results = aggregate_runs({c}, {timed, profiled});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].runs, 1);
  EXPECT_DOUBLE_EQ(results[0].tokens_per_s.median, 100.0);
  ASSERT_TRUE(results[0].phases);
  EXPECT_DOUBLE_EQ(results[0].phases->step_ms, 2.0);
  const std::string md = render_phase_markdown({Suite{"peer", "", {c}}}, results);
  EXPECT_NE(md.find("| " + c.name + " | 2.0 | 0.3 (14%)"), std::string::npos) << md;

  // A profiled run that failed leaves the case's timing alone and says why there is no split.
  profiled.summary = nlohmann::json();
  profiled.error = "exited with code 1";
  const auto failed = aggregate_runs({c}, {timed, profiled});
  EXPECT_EQ(failed[0].status, "ok");
  EXPECT_FALSE(failed[0].phases);
  EXPECT_NE(render_phase_markdown({Suite{"peer", "", {c}}}, failed).find("no split**: the profiled run exited with code 1"),
            std::string::npos);
}

}  // namespace
