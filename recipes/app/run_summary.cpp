#include "strata/recipes/app/run_summary.h"

#include "strata/callbacks/model_checkpoint.h"
#include "strata/core/atomic_file.h"

#include "strata/strategies/comm.h"
#include "strata/recipes/app/pipeline_plan.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

namespace strata::recipes {

RunConfig resolved_config(RunConfig c, const ModelConfig& model, int threads) {
  const ModelShape shape = model.shape();
  // What the family resolved, under its own keys (a key another family
  // declares and this one does not read is commented out).
  c.block_size = shape.block_size;
  c.vocab_size = shape.vocab_size;
  for (const auto& [key, value] : model.resolved_numbers()) c.model_options[key] = option_text(value);
  for (const auto& [key, value] : model.resolved_texts()) c.model_options[key] = value;
  c.threads_per_rank = threads;
  c.model_source = model.source_directory();
  // The record names the directory wherever it is read from.
  if (!c.model_source.empty()) c.init_from = c.model_source;
  if (!c.init_adapter.empty()) c.init_adapter = std::filesystem::absolute(c.init_adapter).lexically_normal().string();
  return c;
}

namespace {

/// Per rank (see RankStepStats; "memory" splits peak_tensor_bytes: model
/// state as the strategy reports it at the end of the first step, and
/// activations_other = peak - that state, i.e. activations, gathered FSDP
/// units, buckets and transients at the peak).
nlohmann::json per_rank_json(const FitResult& r) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t rank = 0; rank < r.per_rank.size(); ++rank) {
    const auto& s = r.per_rank[rank];
    nlohmann::json e;
    e["rank"] = rank;
    e["forward_s"] = s.forward_s;
    e["backward_s"] = s.backward_s;
    e["comm_wait_s"] = s.comm_wait_s;
    e["optimizer_s"] = s.optimizer_s;
    e["step_s"] = s.step_s;
    e["tokens_per_s"] = s.tokens_per_s;
    if (rank < r.peak_tensor_bytes.size() && rank < r.model_state_bytes.size()) {
      const auto& m = r.model_state_bytes[rank];
      e["peak_tensor_bytes"] = r.peak_tensor_bytes[rank];
      e["memory"] = {{"params", m.params},
                     {"grads", m.grads},
                     {"optimizer", m.optimizer},
                     {"activations_other", r.peak_tensor_bytes[rank] - m.total()}};
    }
    if (rank < r.peak_rss_bytes.size()) e["peak_rss_bytes"] = r.peak_rss_bytes[rank];
    if (rank < r.setup_peak_rss_bytes.size()) {
      e["setup_rss_bytes"] = r.setup_rss_bytes[rank];
      e["setup_peak_rss_bytes"] = r.setup_peak_rss_bytes[rank];
    }
    nlohmann::json bytes;
    for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
      bytes[collective_name(static_cast<CollectiveKind>(k))] = s.comm_bytes_per_step[k];
    }
    e["comm_bytes_per_step"] = bytes;
    out.push_back(e);
  }
  return out;
}

}  // namespace

nlohmann::json summary_json(const RunConfig& config, const FitResult& r, int world_size,
                            int64_t n_params, const std::string& data_name, const PeakFlops& peak,
                            std::optional<double> mfu) {
  nlohmann::json j;
  j["strategy"] = config.strategy;
  j["world_size"] = world_size;  // the strategy's (data-parallel) ranks
  // Tensor parallelism: the job is world_size x tp_size ranks, per_rank lists them all.
  j["tp_size"] = config.tp_size;
  j["sequence_parallel"] = config.sequence_parallel;
  j["preset"] = config.preset;
  j["data"] = data_name;
  j["precision"] = config.precision;
  j["parameters"] = n_params;
  j["steps"] = r.steps;
  j["final_train_loss"] = r.final_train_loss;
  if (r.loss_scale) {  // 16-mixed only
    j["loss_scale"] = *r.loss_scale;
    j["skipped_steps"] = r.skipped_steps;
  }
  j["val_loss"] = r.val_loss ? nlohmann::json(*r.val_loss) : nlohmann::json(nullptr);
  j["val_accuracy"] = r.val_accuracy ? nlohmann::json(*r.val_accuracy) : nlohmann::json(nullptr);
  j["tokens_per_s"] = r.tokens_per_s;
  j["backward_s_per_step"] = r.backward_s_per_step;    // rank 0's
  j["grad_sync_s_per_step"] = r.grad_sync_s_per_step;  // rank 0's
  // MFU = tokens/s per rank × (6N + 12·L·H·Q·T) / the rank's peak (PaLM's).
  j["mfu"] = mfu ? nlohmann::json(*mfu) : nlohmann::json(nullptr);
  j["peak_flops_per_rank"] = peak.flops;
  j["peak_flops_source"] = peak.source;
  j["elapsed_s"] = r.elapsed_s;
  j["stopped_early"] = r.stopped_early;
  j["stop_reason"] = r.stop_reason;
  j["peak_tensor_bytes"] = r.peak_tensor_bytes;
  j["peak_rss_bytes"] = r.peak_rss_bytes;
  j["model_state_bytes"] = nlohmann::json::array();
  for (size_t rank = 0; rank < r.model_state_bytes.size(); ++rank) {
    const auto& m = r.model_state_bytes[rank];
    // "other": what the peak held beyond model state (activations, buffers).
    const int64_t other = rank < r.peak_tensor_bytes.size() ? r.peak_tensor_bytes[rank] - m.total() : 0;
    j["model_state_bytes"].push_back(
        {{"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer}, {"other", other}});
  }
  nlohmann::json comm;
  for (int k = 0; k < static_cast<int>(CollectiveKind::kCount); ++k) {
    comm[collective_name(static_cast<CollectiveKind>(k))] = r.comm_bytes.sent[k];
  }
  j["comm_bytes_rank0"] = comm;
  j["per_rank"] = per_rank_json(r);
  j["matmul_peak_flops"] = peak.flops;
  j["psi"] = n_params;
  // Bytes rank 0 sent per step over Ψ·(N-1)/N, Ψ = fp32 parameter bytes: the
  // ZeRO paper's multiple (ddp/oss/sdp 2, fsdp 3) independent of N.
  // The data-parallel formula's Ψ(N-1)/N: no yardstick for tensor parallelism's bytes.
  if (world_size > 1 && config.tp_size <= 1 && !r.per_rank.empty() && n_params > 0) {
    double sent = 0.0;
    for (double b : r.per_rank[0].comm_bytes_per_step) sent += b;
    j["comm_ratio_to_psi"] = sent / (4.0 * double(n_params) * double(world_size - 1) / double(world_size));
  } else {
    j["comm_ratio_to_psi"] = nullptr;
  }
  return j;
}

void add_predictions(nlohmann::json& summary, const std::vector<StagePrediction>& stages,
                     const std::optional<CommEstimate>& comm) {
  TORCH_CHECK(!stages.empty(), "add_predictions: no stage");
  std::optional<int64_t> largest;
  for (const auto& s : stages) {
    if (s.peak) largest = std::max(largest.value_or(0), *s.peak);
  }
  if (largest) summary["predicted_peak_bytes"] = *largest;
  if (comm) {
    nlohmann::json bytes = nlohmann::json::object();
    for (const auto& [kind, b] : comm->bytes) bytes[collective_name(kind)] = b;
    summary["predicted_comm_bytes_per_step"] = bytes;
  }
  auto& ranks = summary["per_rank"];
  const size_t per_stage = std::max<size_t>(1, ranks.size() / stages.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto& e = ranks[r];
    const auto& [state, peak] = stages[std::min(stages.size() - 1, r / per_stage)];
    e["predicted"] = {{"params", state.params}, {"grads", state.grads}, {"optimizer", state.optimizer}};
    if (peak) e["predicted"]["peak"] = *peak;
    if (!e.contains("memory")) continue;
    auto ratio = [](int64_t measured, int64_t predicted) {
      return predicted > 0 ? nlohmann::json(double(measured) / double(predicted)) : nlohmann::json(nullptr);
    };
    const auto& m = e["memory"];
    e["measured_over_predicted"] = {
        {"params", ratio(m["params"].get<int64_t>(), state.params)},
        {"grads", ratio(m["grads"].get<int64_t>(), state.grads)},
        {"optimizer", ratio(m["optimizer"].get<int64_t>(), state.optimizer)},
        {"peak", ratio(e["peak_tensor_bytes"].get<int64_t>(), peak.value_or(0))}};
  }
}

/// Rank 0's checkpoint saves: how long each held the step loop and how long
/// its write took (summary.json's checkpoint_saves; empty without checkpoints).
nlohmann::json checkpoint_saves(const std::vector<std::shared_ptr<Callback>>& callbacks) {
  nlohmann::json saves = nlohmann::json::array();
  for (const auto& cb : callbacks) {
    const auto* checkpoint = dynamic_cast<const ModelCheckpoint*>(cb.get());
    if (checkpoint == nullptr) continue;
    for (const auto& t : checkpoint->timings()) {
      saves.push_back({{"step", t.step}, {"blocked_s", t.blocked_s}, {"write_s", t.write_s}, {"finish_s", t.finish_s},
                       {"async", t.async}});
    }
  }
  return saves;
}

/// "12.3%".
std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * fraction);
  return buf;
}

namespace {

/// summary.json's predictions (add_predictions), asked after fit (the
/// probe's allocations go to its own tracker, so the run's numbers are
/// unaffected): the whole model's over `world` ranks, or each pipeline
/// stage's over its `world` ranks (pipeline_plan.h; not yet with
/// tensor-parallel stages, whose split only the dry run simulates).
void add_model_predictions(nlohmann::json& summary, const CheckedRun& run, const StrategyRegistry& registry,
                           int world, int local_world) {
  const RunConfig& c = run.config;
  const auto request = plan_request(c, run.model, world, local_world);
  const auto estimate = estimate_memory(registry, request);
  if (!estimate) return;
  const auto profile = [&] {
    return activation_profile(*run.model, c.batch_size, parse_precision(c.precision), c.ac_policy);
  };
  if (c.pp_size == 1) {
    std::optional<int64_t> peak;
    if (estimate->predicts_peak) peak = predict_peak(registry, request, profile()).peak();
    add_predictions(summary, {{{estimate->params, estimate->grads, estimate->optimizer}, peak}},
                    predict_comm(registry, request));
    return;
  }
  if (c.tp_size > 1 || !run.pipeline) return;
  const auto peaks = predict_stage_peaks(registry, request, *run.pipeline, profile());
  if (!peaks) return;
  std::vector<StagePrediction> stages;
  for (const auto& p : *peaks) stages.push_back({p.state, p.peak()});
  add_predictions(summary, stages, std::nullopt);  // a stage's sends are not in the models yet
}

}  // namespace

/// Rank 0: summary.json (written last: it marks a finished run) and the
/// closing line.
void write_summary(const CheckedRun& run, const StrategyRegistry& registry, const FitResult& result,
                   Strategy& strategy, const Throughput& throughput, PeakFlops peak, int64_t n_params,
                   const torch::Device& device, const nlohmann::json& saves, int local_world, double ceiling) {
  const RunConfig& c = run.config;
  const int world = strategy.comm().size();
  peak.flops = throughput.peak_flops();  // CUDA: measured by the callback on the device
  const std::optional<double> mfu =
      throughput.mfu() > 0.0 ? std::optional<double>(throughput.mfu()) : std::nullopt;
  auto summary = summary_json(c, result, world, n_params, run.data->name(), peak, mfu);
  summary["device"] = device.str();  // rank 0's; rank r uses cuda:LOCAL_RANK on CUDA
  if (ceiling > 0.0) {  // recipes/app/gemm_ceiling.h: the job's tokens/s at this CPU's GEMM rate
    summary["gemm_ceiling_tokens_per_s"] = ceiling;
    summary["ceiling_share"] = result.tokens_per_s / ceiling;
  }
  add_model_predictions(summary, run, registry, world, local_world);
  for (const auto& [key, value] : strategy.report()) {  // rank 0's
    const bool whole = value == std::floor(value) && std::abs(value) < 1e15;
    summary[key] = whole ? nlohmann::json(static_cast<int64_t>(value)) : nlohmann::json(value);
  }
  if (!saves.empty()) summary["checkpoint_saves"] = saves;
  const std::filesystem::path out_dir(c.output_dir);
  write_file_atomically((out_dir / "summary.json").string(), summary.dump(2) + "\n");
  int64_t peak_tensor = 0;
  for (auto b : result.peak_tensor_bytes) peak_tensor = std::max(peak_tensor, b);
  std::cout << "\n== done: " << result.steps << " steps in " << result.elapsed_s << " s"
            << " | train loss " << result.final_train_loss;
  if (result.val_loss) std::cout << " | val loss " << *result.val_loss;
  if (result.val_accuracy) std::cout << " | val accuracy " << 100.0 * *result.val_accuracy << "%";
  std::cout << " | " << static_cast<int64_t>(result.tokens_per_s) << " tokens/s"
            << " | MFU " << (mfu ? percent(*mfu) : std::string("n/a"))
            << (throughput.mfu_above_one() ? " (above 1 against the peak: set --peak-flops)" : "")
            << (ceiling > 0.0 ? " | " + percent(result.tokens_per_s / ceiling) + " of the GEMM ceiling" : "")
            << " | peak tensor memory " << format_bytes(peak_tensor) << " (max over ranks)"
            << "\n   outputs in " << out_dir.string() << "/ (config.ini, metrics.csv, summary.json)" << std::endl;
}

void write_eval_summary(const CheckedRun& run, const ValidationMetrics& metrics) {
  const double perplexity = std::exp(metrics.loss);
  std::cout << "== eval: loss " << metrics.loss << " | perplexity " << perplexity << " | " << metrics.samples
            << " samples, " << metrics.tokens << " tokens scored | data " << run.data->name() << std::endl;
  const nlohmann::json summary = {{"eval_only", true},         {"val_loss", metrics.loss},
                                  {"perplexity", perplexity},  {"samples", metrics.samples},
                                  {"tokens", metrics.tokens},  {"data", run.data->name()},
                                  {"step", metrics.step}};
  const std::filesystem::path out_dir(run.config.output_dir);
  write_file_atomically((out_dir / "eval.json").string(), summary.dump(2) + "\n");
}

}  // namespace strata::recipes
