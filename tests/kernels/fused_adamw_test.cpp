#include "strata/core/optim_state_key.h"
#include "strata/kernels/fused_adamw.h"
#include "strata/kernels/fused_adamw_optimizer.h"
#include "strata/trainer/trainer.h"

#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using strata::AdamWIsa;
using strata::AdamWStepOptions;
using strata::FusedAdamW;

/// Restores the intra-op thread count on scope exit.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~ScopedThreads() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

/// Parameters of odd sizes (vector tails everywhere), two of them larger than
/// two parallel chunks so 2 threads really split them; the first three decay.
std::vector<torch::Tensor> make_params(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {13, 37}, {3 * strata::kAdamWGrain + 5}, {257, 129}, {1}, {7}, {17}, {2 * strata::kAdamWGrain + 33}}) {
    params.push_back(torch::randn(shape).requires_grad_(true));
  }
  return params;
}

std::vector<torch::Tensor> clone_params(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

std::vector<torch::optim::OptimizerParamGroup> decay_groups(const std::vector<torch::Tensor>& params) {
  auto options = [](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>(params.begin(), params.begin() + 3), options(0.1));
  groups.emplace_back(std::vector<torch::Tensor>(params.begin() + 3, params.end()), options(0.0));
  return groups;
}

/// The same random gradients on both parameter lists (the last param gets
/// none on odd steps: skipped, as AdamW skips it).
void set_grads(std::vector<torch::Tensor>& a, std::vector<torch::Tensor>& b, int step) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (i + 1 == a.size() && step % 2 == 1) {
      a[i].mutable_grad() = torch::Tensor();
      b[i].mutable_grad() = torch::Tensor();
      continue;
    }
    const auto g = torch::randn(a[i].sizes()) * (0.1 * static_cast<double>(i + 1));
    a[i].mutable_grad() = g.clone();
    b[i].mutable_grad() = g.clone();
  }
}

/// The Trainer's schedule changes lr per group between steps.
void set_lr(torch::optim::Optimizer& opt, int step) {
  for (auto& group : opt.param_groups()) group.options().set_lr(1e-2 * (1.0 - step / 200.0));
}

double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs() / (b.abs() + 1e-6)).max().item<double>();
}

/// Parameters and every state tensor equal within 1e-6 (relative + absolute).
void expect_same_state(const std::vector<torch::Tensor>& expected_params, torch::optim::Optimizer& expected,
                       const std::vector<torch::Tensor>& actual_params, torch::optim::Optimizer& actual) {
  ASSERT_EQ(expected.state().size(), actual.state().size());
  for (size_t i = 0; i < expected_params.size(); ++i) {
    const auto& p = expected_params[i];
    const auto& q = actual_params[i];
    EXPECT_TRUE(torch::allclose(q, p, 1e-6, 1e-6)) << "param " << i << " max rel diff " << max_rel_diff(q, p);
    const auto e = expected.state().find(strata::optim_state_key(p));
    const auto a = actual.state().find(strata::optim_state_key(q));
    ASSERT_EQ(e == expected.state().end(), a == actual.state().end()) << "param " << i;
    if (e == expected.state().end()) continue;
    const auto& es = static_cast<torch::optim::AdamWParamState&>(*e->second);
    const auto& as = static_cast<torch::optim::AdamWParamState&>(*a->second);
    EXPECT_EQ(es.step(), as.step()) << "param " << i;
    EXPECT_TRUE(torch::allclose(as.exp_avg(), es.exp_avg(), 1e-6, 1e-6))
        << "exp_avg " << i << " max rel diff " << max_rel_diff(as.exp_avg(), es.exp_avg());
    EXPECT_TRUE(torch::allclose(as.exp_avg_sq(), es.exp_avg_sq(), 1e-6, 1e-6))
        << "exp_avg_sq " << i << " max rel diff " << max_rel_diff(as.exp_avg_sq(), es.exp_avg_sq());
  }
}

/// Threads x kernel (strata's or ATen's fused step).
class FusedAdamWThreadsTest : public ::testing::TestWithParam<std::tuple<int, strata::FusedAdamWKernel>> {};

TEST_P(FusedAdamWThreadsTest, MatchesTorchAdamWOver100StepsWithDecayGroups) {
  ScopedThreads threads(std::get<0>(GetParam()));
  auto ref_params = make_params(7);
  auto fused_params = clone_params(ref_params);
  torch::optim::AdamW reference(decay_groups(ref_params));
  FusedAdamW fused(decay_groups(fused_params), {}, std::get<1>(GetParam()));
  EXPECT_EQ(fused.kernel(), std::get<1>(GetParam()));
  torch::manual_seed(11);
  for (int step = 0; step < 100; ++step) {
    set_grads(ref_params, fused_params, step);
    set_lr(reference, step);
    set_lr(fused, step);
    reference.step();
    fused.step();
  }
  expect_same_state(ref_params, reference, fused_params, fused);
  EXPECT_EQ(fused.fallback_steps(), 0);
  EXPECT_EQ(fused.fused_steps(), 100 * 6 + 50);  // the last param has a grad on even steps only
  const auto& last = static_cast<torch::optim::AdamWParamState&>(
      *fused.state().at(strata::optim_state_key(fused_params.back())));
  EXPECT_EQ(last.step(), 50);
  RecordProperty("isa", strata::adamw_isa_name());
  RecordProperty("max_rel_diff_param0", std::to_string(max_rel_diff(fused_params[0], ref_params[0])));
}

INSTANTIATE_TEST_SUITE_P(ThreadsAndKernel, FusedAdamWThreadsTest,
                         ::testing::Combine(::testing::Values(1, 2),
                                            ::testing::Values(strata::FusedAdamWKernel::kStrata,
                                                              strata::FusedAdamWKernel::kAten)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "Threads" +
                                  strata::fused_adamw_kernel_name(std::get<1>(info.param));
                         });

TEST(FusedAdamWTest, KernelNamesParseAndAnUnknownOneIsRefusedWithTheChoices) {
  for (const auto& name : strata::fused_adamw_kernel_names()) {
    EXPECT_EQ(strata::fused_adamw_kernel_name(strata::parse_fused_adamw_kernel(name)), name);
  }
  try {
    strata::parse_fused_adamw_kernel("mkl");
    FAIL() << "no error";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown AdamW kernel 'mkl'; available: strata, aten"), std::string::npos)
        << e.what();
  }
}

class FusedAdamWIsaTest : public ::testing::TestWithParam<AdamWIsa> {};

TEST_P(FusedAdamWIsaTest, KernelMatchesTorchAdamWOver100Steps) {
  // Each compiled kernel on its own (kAuto picks one per machine), through the
  // buffer API a streamed optimizer step uses.
  if (GetParam() == AdamWIsa::kAvx2 && !strata::adamw_avx2_available()) {
    GTEST_SKIP() << "this build or CPU has no AVX2+FMA kernel";
  }
  const int64_t n = 1003;
  torch::manual_seed(13);
  auto ref = torch::randn({n}).requires_grad_(true);
  torch::optim::AdamW reference({ref}, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1));
  auto p = ref.detach().clone(), m = torch::zeros({n}), v = torch::zeros({n});
  for (int step = 1; step <= 100; ++step) {
    const auto g = torch::randn({n});
    ref.mutable_grad() = g.clone();
    reference.step();
    strata::fused_adamw_step(p, g, m, v, AdamWStepOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1).step(step),
                             {}, GetParam());
  }
  const auto& state = static_cast<torch::optim::AdamWParamState&>(*reference.state().begin()->second);
  EXPECT_TRUE(torch::allclose(p, ref.detach(), 1e-6, 1e-6)) << max_rel_diff(p, ref.detach());
  EXPECT_TRUE(torch::allclose(m, state.exp_avg(), 1e-6, 1e-6)) << max_rel_diff(m, state.exp_avg());
  EXPECT_TRUE(torch::allclose(v, state.exp_avg_sq(), 1e-6, 1e-6)) << max_rel_diff(v, state.exp_avg_sq());
  RecordProperty("bit_exact_param", torch::equal(p, ref.detach()) ? "true" : "false");
}

INSTANTIATE_TEST_SUITE_P(Isa, FusedAdamWIsaTest, ::testing::Values(AdamWIsa::kDefault, AdamWIsa::kAvx2),
                         [](const ::testing::TestParamInfo<AdamWIsa>& info) {
                           return strata::adamw_isa_name(info.param);
                         });

TEST(FusedAdamWTest, RangeCallsEqualOneWholeCallAndTouchNothingElse) {
  const int64_t n = 3 * strata::kAdamWGrain + 11;
  torch::manual_seed(3);
  const auto p0 = torch::randn({n}), g = torch::randn({n}), m0 = torch::randn({n}) * 0.1,
             v0 = torch::rand({n}) * 0.01;
  const auto opts = AdamWStepOptions(3e-3).betas({0.9, 0.95}).weight_decay(0.1).step(5);
  auto whole = std::vector<torch::Tensor>{p0.clone(), m0.clone(), v0.clone()};
  auto bf16_whole = torch::empty({n}, torch::kBFloat16);
  strata::fused_adamw_step(whole[0], g, whole[1], whole[2], opts, bf16_whole);
  EXPECT_FALSE(torch::equal(whole[0], p0));
  EXPECT_TRUE(torch::equal(bf16_whole, whole[0].to(torch::kBFloat16)));  // bf16 copy: round to nearest even

  auto parts = std::vector<torch::Tensor>{p0.clone(), m0.clone(), v0.clone()};
  auto bf16_parts = torch::zeros({n}, torch::kBFloat16);
  const std::vector<int64_t> cuts{0, 5, 5, 40000, 40001, n - 3, n};
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    strata::fused_adamw_step_range(parts[0], g, parts[1], parts[2], opts, cuts[i], cuts[i + 1], bf16_parts);
  }
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(torch::equal(parts[k], whole[k])) << "buffer " << k;
  EXPECT_TRUE(torch::equal(bf16_parts, bf16_whole));

  // One range alone: the elements outside it keep their values.
  auto one = std::vector<torch::Tensor>{p0.clone(), m0.clone(), v0.clone()};
  strata::fused_adamw_step_range(one[0], g, one[1], one[2], opts, 100, 40001);
  const auto inside = torch::indexing::Slice(100, 40001);
  EXPECT_TRUE(torch::equal(one[0].index({inside}), whole[0].index({inside})));
  EXPECT_TRUE(torch::equal(one[0].index({torch::indexing::Slice(0, 100)}), p0.index({torch::indexing::Slice(0, 100)})));
  EXPECT_TRUE(torch::equal(one[2].index({torch::indexing::Slice(40001, n)}), v0.index({torch::indexing::Slice(40001, n)})));
}

TEST(FusedAdamWTest, CheckpointsMoveBetweenTorchAdamWAndFusedAdamW) {
  for (const bool fused_first : {false, true}) {
    SCOPED_TRACE(fused_first ? "saved by FusedAdamW, loaded by AdamW" : "saved by AdamW, loaded by FusedAdamW");
    auto a_params = make_params(21);
    auto b_params = clone_params(a_params);
    torch::optim::AdamW reference(decay_groups(a_params));  // runs all 20 steps
    std::unique_ptr<torch::optim::Optimizer> first =
        fused_first ? std::unique_ptr<torch::optim::Optimizer>(std::make_unique<FusedAdamW>(decay_groups(b_params)))
                    : std::make_unique<torch::optim::AdamW>(decay_groups(b_params));
    torch::manual_seed(5);
    for (int step = 0; step < 10; ++step) {
      set_grads(a_params, b_params, step);
      reference.step();
      first->step();
    }
    std::ostringstream saved;
    {
      torch::serialize::OutputArchive archive;
      first->save(archive);
      archive.save_to(saved);
    }
    // A fresh optimizer of the other class over fresh parameter tensors with the same values.
    auto c_params = clone_params(b_params);
    std::unique_ptr<torch::optim::Optimizer> second =
        fused_first ? std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::AdamW>(decay_groups(c_params)))
                    : std::make_unique<FusedAdamW>(decay_groups(c_params));
    {
      std::istringstream in(saved.str());
      torch::serialize::InputArchive archive;
      archive.load_from(in);
      second->load(archive);
    }
    for (int step = 10; step < 20; ++step) {
      set_grads(a_params, c_params, step);
      reference.step();
      second->step();
    }
    expect_same_state(a_params, reference, c_params, *second);
  }
}

TEST(FusedAdamWTest, TensorsTheKernelCannotTakeUseTheReferenceMath) {
  // A non-contiguous parameter (a transposed leaf) and an amsgrad group.
  torch::manual_seed(9);
  std::vector<torch::Tensor> ref{torch::randn({9, 5}).t().requires_grad_(true), torch::randn({33}).requires_grad_(true)};
  auto fused_params = clone_params(ref);
  fused_params[0] = ref[0].detach().clone().t().contiguous().t().requires_grad_(true);  // same strides as ref[0]
  ASSERT_FALSE(fused_params[0].is_contiguous());
  auto groups = [](const std::vector<torch::Tensor>& p) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(std::vector<torch::Tensor>{p[0]},
                   std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).weight_decay(0.1)));
    g.emplace_back(std::vector<torch::Tensor>{p[1]},
                   std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-2).amsgrad(true)));
    return g;
  };
  torch::optim::AdamW reference(groups(ref));
  FusedAdamW fused(groups(fused_params));
  for (int step = 0; step < 20; ++step) {
    set_grads(ref, fused_params, 0);
    reference.step();
    fused.step();
  }
  expect_same_state(ref, reference, fused_params, fused);
  EXPECT_EQ(fused.fused_steps(), 0);
  EXPECT_EQ(fused.fallback_steps(), 40);
}

TEST(FusedAdamWTest, BadBuffersAndOptionsAreErrorsNamingTheValues) {
  const auto p = torch::zeros({10}), g = torch::zeros({10}), m = torch::zeros({10}), v = torch::zeros({10});
  const auto opts = AdamWStepOptions(1e-3);
  auto message = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  auto expect_error = [&](const std::function<void()>& fn, const std::vector<std::string>& parts) {
    const std::string text = message(fn);
    for (const auto& part : parts) EXPECT_NE(text.find(part), std::string::npos) << text << " lacks " << part;
  };
  expect_error([&] { strata::fused_adamw_step(p, torch::zeros({11}), m, v, opts); }, {"grad", "11", "10"});
  expect_error([&] { strata::fused_adamw_step(p, g, m.to(torch::kDouble), v, opts); }, {"exp_avg", "Double"});
  expect_error([&] { strata::fused_adamw_step(p, g, m, torch::zeros({10, 2}).select(1, 0), opts); },
               {"exp_avg_sq", "contiguous"});
  expect_error([&] { strata::fused_adamw_step_range(p, g, m, v, opts, 4, 11); }, {"[4, 11)", "10"});
  expect_error([&] { strata::fused_adamw_step(p, g, m, v, AdamWStepOptions(1e-3).step(0)); }, {"step", "0"});
  expect_error([&] { strata::fused_adamw_step(p, g, m, v, AdamWStepOptions(1e-3).betas({0.9, 1.0})); },
               {"betas", "0.9", "1"});
  expect_error([&] { strata::fused_adamw_step(p, g, m, v, opts, torch::zeros({10})); }, {"param_bf16", "BFloat16"});
}

TEST(FusedAdamWTest, TrainerBuildsFusedAdamWUnlessSwitchedOff) {
  auto params = make_params(1);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(params, std::make_unique<torch::optim::AdamWOptions>(1e-3));
  auto fused = strata::optimizer_factory(strata::TrainerOptions())(groups);
  EXPECT_NE(dynamic_cast<FusedAdamW*>(fused.get()), nullptr);
  auto plain = strata::optimizer_factory(strata::TrainerOptions().fused_adamw(false))(groups);
  EXPECT_EQ(dynamic_cast<FusedAdamW*>(plain.get()), nullptr);
  EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(plain.get()), nullptr);
}

}  // namespace
