// strata-bench: sweeps strategies over GPT recipes by running strata-gpt once
// per case, prints Markdown tables, writes JSON lines and charts, and gates
// regressions against a baseline (fairscale's --check_regression idea).
//
//   build/bin/strata-bench --suite zero,memory --out bench-out     # results.{jsonl,md}, *.png
//   build/bin/strata-bench --suite smoke --baseline bench/baselines/smoke.jsonl   # CI gate
//   build/bin/strata-bench --suite smoke --write-baseline bench/baselines/smoke.jsonl
//   build/bin/strata-bench --sweep --presets gpt-micro,gpt-mini --strategies ddp,oss,sdp,fsdp
//       --ac 0,1 --offload none,disk --precision fp32,bf16-mixed --nproc 2 --out sweep-out
//   build/bin/strata-bench --sweep-config sweep.ini --out sweep-out   # the same keys, key = value
//   build/bin/strata-bench --suite zero --from-json runs.jsonl    # re-render saved runs
//
// Exit codes: 0 ok, 1 a case failed or regressed, 2 bad input.
//
// bench_main() is strata-bench's main over a StrategyRegistry: strata-bench
// passes the built-ins; a project with strategies of its own builds its own
// strata-bench around it (examples/local_sgd), and its strategies get suites,
// sweep cases, report rows and chart colours from their specs.
#include "strata/bench/bench_main.h"
#include "strata/bench/checkpoint_bench.h"
#include "strata/bench/charts.h"
#include "strata/bench/gate.h"
#include "strata/bench/harness.h"
#include "strata/bench/output_files.h"
#include "strata/bench/peer_suite.h"
#include "strata/bench/planner_suite.h"
#include "strata/bench/pp_suite.h"
#include "strata/bench/report.h"
#include "strata/bench/sweep.h"
#include "strata/core/atomic_file.h"

#include <boost/program_options.hpp>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace strata::bench;

#ifndef STRATA_SOURCE_DIR
#define STRATA_SOURCE_DIR "."
#endif

namespace {

struct CliOptions {
  std::string suites = "smoke";
  std::optional<int> repeats;
  std::string gpt;
  std::string python;  ///< --python: runs the peer suite's PyTorch programs
  std::string json_path, markdown_path, baseline_path, write_baseline_path, work_dir, from_json, out_dir;
  std::string inject_regression;
  bool keep_work_dir = false;
  bool list = false;
  std::string only;  ///< run only the cases whose name contains this ("": all)
  double case_timeout_s = 600;
  GateOptions gate;
  // sweep
  bool sweep = false;
  std::string sweep_config;
  std::string presets, strategies = "", ac = "0", offload = "none", precision = "fp32",
              nproc = "2", batch_size = "8", block_size = "64", device = "cpu", pp = "1", pp_schedule = "1f1b",
              microbatches = "1";
  int64_t steps = 20;
  int threads_per_rank = 1;
};

std::string default_gpt_binary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "strata-gpt" : (self.parent_path() / "strata-gpt").string();
}

/// Every file the run will write, with the flag that names it.
std::vector<std::pair<std::string, std::string>> outputs_of(const CliOptions& cli) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!cli.json_path.empty()) out.emplace_back("--json", cli.json_path);
  if (!cli.markdown_path.empty()) out.emplace_back("--markdown", cli.markdown_path);
  if (!cli.write_baseline_path.empty()) out.emplace_back("--write-baseline", cli.write_baseline_path);
  if (!cli.out_dir.empty()) {
    for (const char* name : {"results.md", "results.jsonl", "runs.jsonl", "tokens_per_s.dat", "tokens_per_s.gp",
                             "tokens_per_s.png", "memory.dat", "memory.gp", "memory.png"}) {
      if (std::string(name) == "runs.jsonl" && !cli.json_path.empty()) continue;  // --json replaces it
      out.emplace_back("--out", (fs::path(cli.out_dir) / name).string());
    }
  }
  return out;
}

/// Bad input for the files: an output that is also an input (writing it
/// would destroy what is being read), two outputs in one file, or an output
/// that cannot be written. Checked before anything is read or written.
void check_files(const CliOptions& cli) {
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {"--from-json", cli.from_json}, {"--baseline", cli.baseline_path}, {"--sweep-config", cli.sweep_config}};
  const auto outputs = outputs_of(cli);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, path] = outputs[i];
    for (const auto& [in_flag, in_path] : inputs) {
      TORCH_CHECK_VALUE(in_path.empty() || !same_file(path, in_path), flag, " would write '", path,
                        "', which is the ", in_flag, " input; write the outputs elsewhere");
    }
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK_VALUE(!same_file(path, outputs[j].second), flag, " and ", outputs[j].first, " both write '", path,
                        "'; give them different files");
    }
    if (flag != "--out") check_writable_file(flag, path);
  }
  check_creatable_dir("--out", cli.out_dir);
  check_creatable_dir("--work-dir", cli.work_dir);
}

std::string duration_text(double s) {
  const int64_t total = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (total >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", (long long)(total / 3600), (long long)(total % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", (long long)(total / 60), (long long)(total % 60));
  }
  return buf;
}

/// Runs the cases in a work dir (progress with elapsed time and ETA on stderr,
/// a JSON line per run to `json` if open). Failed runs come back with their
/// error; the sweep goes on.
std::vector<CaseRun> run_cases(const std::vector<BenchCase>& cases, RunOptions options, bool keep_work_dir,
                               const ReportHeader& header, std::ofstream& json) {
  bool own_work_dir = false;
  if (options.work_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "strata-bench-XXXXXX").string();
    TORCH_CHECK(::mkdtemp(tmpl.data()) != nullptr, "cannot create a work directory from ", tmpl);
    options.work_dir = tmpl;
    own_work_dir = !keep_work_dir;
  } else {
    fs::create_directories(options.work_dir);
  }
  size_t runnable = 0;
  size_t profiled = 0;  // each phase_split case's one more, untimed run
  for (const auto& c : cases) {
    runnable += c.skip_reason.empty();
    profiled += c.skip_reason.empty() && c.phase_split;
  }
  const size_t total = runnable * options.repeats + profiled;
  size_t done = 0;
  bool any_failed = false;
  const auto start = std::chrono::steady_clock::now();
  options.on_run = [&](const CaseRun& run) {
    ++done;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // ETA from the mean time per run so far (runs of one case are alike).
    const double eta = elapsed / double(done) * double(total - std::min(done, total));
    std::cerr << "[" << done << "/" << total << " | elapsed " << duration_text(elapsed) << ", ETA "
              << duration_text(eta) << "] " << run.bench_case->name << " "
              << (run.profiled ? std::string("profiled run (phase split)")
                               : "run " + std::to_string(run.repeat + 1) + "/" + std::to_string(options.repeats))
              << ": ";
    if (!run.error.empty()) {
      any_failed = true;
      std::cerr << "FAILED: " << run.error << "\n  " << run.command << "\n--- last lines of its output ---\n"
                << run.output_tail << "---" << std::endl;
    } else {
      const auto& s = run.summary;
      if (run.profiled && s.contains("phase_split_error")) std::cerr << s.at("phase_split_error") << ", ";
      std::cerr << static_cast<int64_t>(s.at("tokens_per_s").get<double>()) << " tokens/s, peak "
                << format_mib(double(peak_tensor_bytes_max(s))) << "/rank, " << run.wall_s << " s" << std::endl;
    }
    if (json.is_open()) json << run_record(run, header).dump() << std::endl;
  };
  std::cerr << "strata-bench: " << runnable << " case(s) x " << options.repeats << " repeat(s)"
            << (runnable < cases.size() ? " (" + std::to_string(cases.size() - runnable) + " skipped)" : "") << ", "
            << options.gpt_binary << ", work dir " << options.work_dir << std::endl;
  for (const auto& c : cases)
    if (!c.skip_reason.empty()) std::cerr << "skipped: " << c.name << ": " << c.skip_reason << std::endl;
  auto runs = run_interleaved(cases, options);
  if (own_work_dir && !any_failed) fs::remove_all(options.work_dir);
  if (any_failed) std::cerr << "work dir kept for the failed runs' logs: " << options.work_dir << std::endl;
  return runs;
}

Suite sweep_from(const CliOptions& cli, const strata::StrategyRegistry& strategies,
                 const strata::recipes::ModelRegistry& models) {
  std::vector<int> nproc, pp;
  for (auto n : split_int_list(cli.nproc, "nproc")) nproc.push_back(static_cast<int>(n));
  for (auto n : split_int_list(cli.pp, "pp")) pp.push_back(static_cast<int>(n));
  return make_sweep(SweepOptions()
                        .presets(cli.presets.empty() ? std::vector<std::string>{} : split_list(cli.presets, "presets"))
                        .strategies(cli.strategies.empty() ? std::vector<std::string>{}
                                                           : split_list(cli.strategies, "strategies"))
                        .ac(split_int_list(cli.ac, "ac"))
                        .offload(split_list(cli.offload, "offload"))
                        .precision(split_list(cli.precision, "precision"))
                        .nproc(nproc)
                        .pp(pp)
                        .pp_schedule(cli.pp_schedule)
                        .microbatches(split_int_list(cli.microbatches, "microbatches"))
                        .batch_size(split_int_list(cli.batch_size, "batch-size"))
                        .block_size(split_int_list(cli.block_size, "block-size"))
                        .steps(cli.steps)
                        .threads_per_rank(cli.threads_per_rank)
                        .device(cli.device),
                    strategies, models);
}

/// The run's options from the command line; exit-2 errors for bad values.
RunOptions run_options_of(const CliOptions& cli, const std::vector<Suite>& suites, const std::vector<BenchCase>& cases) {
  bool only_smoke = !cli.sweep;
  for (const auto& s : suites) only_smoke &= s.name == "smoke";
  RunOptions options(cli.gpt.empty() ? default_gpt_binary() : cli.gpt, cli.work_dir);
  options.repeats = cli.repeats.value_or(only_smoke || cli.sweep ? 1 : 3);
  options.case_timeout_s = cli.case_timeout_s;
  options.inject_regression = cli.inject_regression;
  options.python = cli.python.empty() ? STRATA_PYTHON : cli.python;
  options.peer_script = (fs::path(STRATA_SOURCE_DIR) / "bench" / "peers" / "gpt_peer.py").string();
  TORCH_CHECK_VALUE(options.repeats >= 1, "--repeats must be >= 1, got ", options.repeats);
  TORCH_CHECK_VALUE(cli.case_timeout_s > 0, "--case-timeout must be > 0 seconds, got ", cli.case_timeout_s);
  bool needs_python = false;
  for (const auto& c : cases) needs_python |= c.program == "peer" || c.shared_init;
  if (needs_python) {
    TORCH_CHECK_VALUE(!options.python.empty() && ::access(options.python.c_str(), X_OK) == 0,
                      "the peer suite needs a Python with torch: --python '", options.python,
                      "' is not executable (scripts/setup's venv is the default)");
    TORCH_CHECK_VALUE(fs::exists(options.peer_script), "the peer program ", options.peer_script, " is missing");
  }
  if (!cli.inject_regression.empty()) {
    bool known = false;
    for (const auto& c : cases) known |= c.name == cli.inject_regression;
    TORCH_CHECK_VALUE(known, "--inject-regression '", cli.inject_regression, "' names no selected case");
  }
  return options;
}

void list_cases(const std::vector<BenchCase>& cases, const RunOptions& options) {
  for (const auto& c : cases) {
    std::cout << c.name << (c.reference.empty() ? "" : " (vs " + c.reference + ")")
              << (c.skip_reason.empty() ? "" : " (skipped: " + c.skip_reason + ")") << "\n ";
    const auto argv = c.program == "peer"
                          ? peer_command(c, options.python, options.peer_script, "<generated-text>", "<out>")
                          : gpt_command(c, options.gpt_binary, "<generated-text>", "<out>");
    for (const auto& arg : argv) std::cout << " " << arg;
    if (c.shared_init) std::cout << " --init-from <init-" << c.preset << (c.shared_init_format == "hf" ? "/>" : ".pt>");
    std::cout << "\n";
  }
}

/// The report: Markdown on stdout (and --markdown), --out's files, --write-baseline.
void write_reports(const CliOptions& cli, const std::vector<Suite>& suites, const std::vector<CaseResult>& results,
                   const std::vector<CaseRun>& runs, const ReportHeader& header,
                   const strata::StrategyRegistry& strategies, const strata::recipes::ModelRegistry& models) {
  std::string markdown = render_markdown(suites, results, header);
  markdown += "\n### per rank\n\n" + render_per_rank_markdown(suites, results);
  markdown += render_phase_markdown(suites, results);
  bool planner = false;
  for (const auto& s : suites) planner |= s.name == "planner";
  if (planner) markdown += planner_markdown(runs);
  markdown += pp_markdown(runs);  // "" without a pipeline case
  for (const auto& s : suites)
    if (s.name == "peer") markdown += peer_markdown(results, strategies, models);
  std::cout << markdown << std::flush;
  if (!cli.markdown_path.empty()) write_text(cli.markdown_path, markdown, "--markdown");
  if (!cli.out_dir.empty()) {
    const fs::path out(cli.out_dir);
    write_text((out / "results.md").string(), markdown, "--out");
    std::string lines;
    for (const auto& r : results) lines += case_record(r, header).dump() + "\n";
    write_text((out / "results.jsonl").string(), lines, "--out");
    ChartFiles charts = write_charts(results, cli.out_dir, strategies);
    if (std::any_of(suites.begin(), suites.end(), [](const Suite& s) { return s.name == "peer"; })) {
      const ChartFiles peer = draw_charts({{"peer", peer_chart_data(results, strategies, models),
                                            "strata and PyTorch 2.x on the same job: tokens/s ÷ the faster PyTorch "
                                            "(eager or compiled), higher is faster"},
                                           {"ceiling", peer_ceiling_chart_data(results, strategies, models),
                                            "share of the job's GEMM-bound ceiling (tokens/s if every FLOP ran at "
                                            "this CPU's rate for the model's own matrix products)"}},
                                          cli.out_dir);
      charts.written.insert(charts.written.end(), peer.written.begin(), peer.written.end());
      if (!peer.note.empty()) charts.note = peer.note;
    }
    if (std::any_of(suites.begin(), suites.end(), [](const Suite& s) { return s.name == "pp"; })) {
      const ChartFiles pp = draw_charts({{"pp_bubble", pp_bubble_chart(runs),
                                          "each rank's idle share of a pipeline step (pp 2), measured, simulated "
                                          "with the run's costs, and by the formula"}},
                                        cli.out_dir);
      charts.written.insert(charts.written.end(), pp.written.begin(), pp.written.end());
      if (!pp.note.empty()) charts.note = pp.note;
    }
    if (!charts.note.empty()) std::cerr << "note: " << charts.note << std::endl;
    std::cerr << "wrote " << (out / "results.md").string() << ", results.jsonl, runs.jsonl";
    for (const auto& f : charts.written) std::cerr << ", " << fs::path(f).filename().string();
    std::cerr << std::endl;
  }
  if (!cli.write_baseline_path.empty()) {
    write_text(cli.write_baseline_path, baseline_text(results), "--write-baseline");
    std::cerr << "wrote baseline " << cli.write_baseline_path << std::endl;
  }
}

/// Exit code: 1 when a case failed or the gate found a regression.
int gate(const CliOptions& cli, const std::vector<CaseResult>& results,
         const std::map<std::string, BaselineEntry>& baseline) {
  int failed = 0;
  for (const auto& r : results) failed += r.status == "failed";
  if (failed > 0) std::cerr << failed << " case(s) failed (see above)" << std::endl;
  if (cli.baseline_path.empty()) return failed > 0 ? 1 : 0;
  const auto regressions = compare_to_baseline(results, baseline, cli.gate);
  if (!regressions.empty()) {
    std::cerr << "\nregression gate FAILED against " << cli.baseline_path << ": " << regressions.size()
              << " check(s) moved\n\n"
              << render_regressions(regressions) << std::endl;
    for (const auto& r : regressions) std::cerr << r.message() << std::endl;
    return 1;
  }
  std::cerr << "regression gate passed against " << cli.baseline_path << " (memory +"
            << cli.gate.max_memory_growth * 100 << "%, bytes sent exact, tokens/s ÷ ref -"
            << cli.gate.max_ratio_drop * 100 << "%)" << std::endl;
  return failed > 0 ? 1 : 0;
}

int run(const CliOptions& cli, const strata::StrategyRegistry& strategies,
        const strata::recipes::ModelRegistry& models) {
  // ---- Everything that can be wrong with the input, before any case runs (exit 2). ----
  SuiteRegistry registry;
  register_builtin_suites(registry, strategies, models);
  const std::vector<Suite> suites =
      cli.sweep ? std::vector<Suite>{sweep_from(cli, strategies, models)} : registry.select(cli.suites);
  std::vector<BenchCase> cases = all_cases(suites);
  if (!cli.only.empty()) {
    const size_t before = cases.size();
    std::erase_if(cases, [&](const BenchCase& c) { return c.name.find(cli.only) == std::string::npos; });
    TORCH_CHECK_VALUE(!cases.empty(), "--only '", cli.only, "' matches none of the ", before,
                      " cases of the suites chosen; --list prints their names");
  }
  const RunOptions run_options = run_options_of(cli, suites, cases);
  if (cli.list) {
    list_cases(cases, run_options);
    return 0;
  }
  if (cli.from_json.empty())
    TORCH_CHECK_VALUE(::access(run_options.gpt_binary.c_str(), X_OK) == 0, "strata-gpt not found or not executable ",
                      "at '", run_options.gpt_binary, "'; build it (cmake --build build --target strata-gpt) or pass ",
                      "--gpt PATH");
  validate(cli.gate);
  check_files(cli);
  // The inputs are read in full before any output is created.
  std::map<std::string, BaselineEntry> baseline;
  if (!cli.baseline_path.empty()) baseline = read_baseline(cli.baseline_path);
  ReportHeader header;
  header.libtorch = libtorch_version();
  std::vector<CaseRun> runs;
  if (!cli.from_json.empty()) runs = read_runs(cli.from_json, cases, &header);
  if (!cli.out_dir.empty()) create_dir("--out", cli.out_dir);
  if (!cli.work_dir.empty()) create_dir("--work-dir", cli.work_dir);
  std::ofstream json;
  const std::string json_path =
      !cli.json_path.empty() ? cli.json_path : cli.out_dir.empty() ? "" : (fs::path(cli.out_dir) / "runs.jsonl").string();
  if (!json_path.empty()) {
    json.open(json_path);
    TORCH_CHECK_VALUE(json.good(), "--json file '", json_path, "' cannot be written");
  }

  // ---- Run (or re-read), report, gate. ----
  if (!cli.from_json.empty()) {
    if (json.is_open())
      for (const auto& run : runs) json << run_record(run, header).dump() << "\n";
  } else {
    header.machine = machine_info();
    header.commit = git_commit(STRATA_SOURCE_DIR);
    header.date = utc_now();
    header.repeats = run_options.repeats;
    runs = run_cases(cases, run_options, cli.keep_work_dir, header, json);
  }
  const std::vector<CaseResult> results = aggregate_runs(cases, runs);
  write_reports(cli, suites, results, runs, header, strategies, models);
  return gate(cli, results, baseline);
}

/// Reads the command line (and --sweep-config) into `cli`; an exit code when
/// strata-bench should stop here (--help: 0, bad input: 2).
/// "comma-separated suites: a,b,...; or checkpoint alone (...)".
std::string suites_help(const strata::StrategyRegistry& strategies, const strata::recipes::ModelRegistry& models) {
  SuiteRegistry registry;
  register_builtin_suites(registry, strategies, models);
  std::string help = "comma-separated suites: ";
  const auto names = registry.names();
  for (size_t i = 0; i < names.size(); ++i) help += (i ? "," : "") + names[i];
  return help + "; or checkpoint alone (save/load times, checkpoint_bench.cpp)";
}

/// The main options, bound to `cli` (and --repeats to `repeats`).
po::options_description main_options(CliOptions& cli, int& repeats, const strata::StrategyRegistry& strategies,
                                     const strata::recipes::ModelRegistry& models) {
  const std::string suites_text = suites_help(strategies, models);
  po::options_description desc(
      "strata-bench: run strata-gpt over strategy/recipe suites or a sweep and report throughput and memory\n"
      "Exit codes: 0 ok, 1 a case failed or regressed, 2 bad input");
  desc.add_options()
      ("help,h", "show this help")
      ("suite", po::value(&cli.suites)->default_value(cli.suites), suites_text.c_str())
      ("repeats", po::value(&repeats), "runs per case, interleaved (default: 1 for smoke alone or a sweep, else 3)")
      ("gpt", po::value(&cli.gpt), "strata-gpt binary (default: next to strata-bench)")
      ("python", po::value(&cli.python), "Python with torch for --suite peer (default: the build's venv)")
      ("out", po::value(&cli.out_dir),
       "write DIR/results.jsonl (one line per case), results.md, runs.jsonl (one line per run), "
       "tokens_per_s.png and memory.png (gnuplot; with their .dat/.gp)")
      ("json", po::value(&cli.json_path), "write one JSON line per run to FILE")
      ("markdown", po::value(&cli.markdown_path), "also write the Markdown report to FILE")
      ("baseline", po::value(&cli.baseline_path), "gate against this baseline (JSON lines); exit 1 on regression")
      ("write-baseline", po::value(&cli.write_baseline_path), "write the measured values as a baseline FILE")
      ("max-ratio-drop", po::value(&cli.gate.max_ratio_drop)->default_value(cli.gate.max_ratio_drop),
       "fail if a case's tokens/s ÷ its reference case's drops more than this below the baseline's ratio")
      ("max-memory-growth", po::value(&cli.gate.max_memory_growth)->default_value(cli.gate.max_memory_growth),
       "fail if peak tensor or model-state bytes > (1 + this) x baseline")
      ("case-timeout", po::value(&cli.case_timeout_s)->default_value(cli.case_timeout_s), "seconds per run")
      ("work-dir", po::value(&cli.work_dir), "keep outputs here (default: a temp dir, removed afterwards)")
      ("keep-work-dir", po::bool_switch(&cli.keep_work_dir), "do not remove the temp work dir")
      ("list", po::bool_switch(&cli.list), "print the cases and their strata-gpt commands, run nothing")
      ("only", po::value(&cli.only), "run only the cases whose name contains TEXT (e.g. peer/llama-mini)")
      ("from-json", po::value(&cli.from_json),
       "run nothing: report (and gate) the runs in FILE, a --json output, for the cases of --suite");
  return desc;
}

/// The sweep's axes, bound to `cli` (also read from --sweep-config).
po::options_description sweep_options(CliOptions& cli, const std::string& presets_text,
                                      const std::string& strategies_text, const std::string& offload_text) {
  po::options_description sweep("Sweep options (instead of --suite; also as key = value lines in --sweep-config)");
  sweep.add_options()
      ("sweep", po::bool_switch(&cli.sweep), "run the cross product of the axes below")
      ("sweep-config", po::value(&cli.sweep_config), "INI file with the sweep keys below (implies --sweep)")
      ("presets", po::value(&cli.presets), presets_text.c_str())
      ("strategies", po::value(&cli.strategies), strategies_text.c_str())
      ("ac", po::value(&cli.ac)->default_value(cli.ac), "activation checkpointing values (0 off, n every n-th block)")
      ("offload", po::value(&cli.offload)->default_value(cli.offload), offload_text.c_str())
      ("precision", po::value(&cli.precision)->default_value(cli.precision), "fp32, bf16-mixed")
      ("nproc", po::value(&cli.nproc)->default_value(cli.nproc), "world sizes")
      ("pp", po::value(&cli.pp)->default_value(cli.pp), "pipeline sizes (--pp-size; 1: none)")
      ("pp-schedule", po::value(&cli.pp_schedule)->default_value(cli.pp_schedule), "the pipelines' schedule")
      ("microbatches", po::value(&cli.microbatches)->default_value(cli.microbatches),
       "micro-batches per step (--accumulate-grad-batches)")
      ("batch-size", po::value(&cli.batch_size)->default_value(cli.batch_size), "batch sizes per rank")
      ("block-size", po::value(&cli.block_size)->default_value(cli.block_size), "context lengths")
      ("steps", po::value(&cli.steps)->default_value(cli.steps), "steps per case")
      ("threads-per-rank", po::value(&cli.threads_per_rank)->default_value(cli.threads_per_rank),
       "intra-op threads per rank")
      ("device", po::value(&cli.device)->default_value(cli.device), "cpu or cuda (pinned per case)");
  return sweep;
}

std::optional<int> parse_cli(int argc, char** argv, CliOptions& cli, const strata::StrategyRegistry& strategies,
                             const strata::recipes::ModelRegistry& models) {
  int repeats = 0;
  const auto desc = main_options(cli, repeats, strategies, models);
  const std::string reference = strategies.reference() ? strategies.reference()->name() : "none";
  const auto sweep = sweep_options(cli,
                                   "comma-separated presets: " + c10::Join(", ", models.preset_names()) +
                                       " (default: " + models.default_preset() + ")",
                                   "comma-separated strategies: " + strategies.available() +
                                       " (default: the reference strategy, " + reference + ")",
                                   "none, cpu, disk (what moves is each strategy's choice)");
  po::options_description hidden;
  hidden.add_options()
      ("inject-regression", po::value(&cli.inject_regression),
       "testing aid: CASE runs with strata-gpt --debug-extra-param-copy");
  po::options_description all;
  all.add(desc).add(sweep).add(hidden);
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, all), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n" << sweep << std::endl;
      return 0;
    }
    if (vm.count("sweep-config")) {
      const std::string path = vm["sweep-config"].as<std::string>();
      std::ifstream in(path);
      if (!in) {
        std::cerr << "error: --sweep-config file '" << path << "' cannot be read" << std::endl;
        return 2;
      }
      // The command line was stored first, so it wins over the file.
      po::store(po::parse_config_file(in, sweep), vm);
    }
    po::notify(vm);
    if (vm.count("repeats")) cli.repeats = repeats;
    if (!cli.sweep_config.empty()) cli.sweep = true;
    if (cli.sweep && !vm["suite"].defaulted()) {
      std::cerr << "error: --suite and --sweep exclude each other; give one" << std::endl;
      return 2;
    }
  } catch (const po::error& e) {
    std::cerr << "error: " << e.what() << "; see --help" << std::endl;
    return 2;
  }
  return std::nullopt;
}

}  // namespace

namespace strata::bench {

int bench_main(int argc, char** argv, const StrategyRegistry& strategies) {
  recipes::ModelRegistry models;
  recipes::register_builtin_models(models);
  return bench_main(argc, argv, strategies, models);
}

int bench_main(int argc, char** argv, const StrategyRegistry& strategies, const recipes::ModelRegistry& models) {
  // The checkpoint suite runs in-process on its own ranks (checkpoint_bench.h).
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--suite=checkpoint" || (a == "--suite" && i + 1 < argc && std::string(argv[i + 1]) == "checkpoint")) {
      return run_checkpoint_suite(argc, argv, models);
    }
  }
  CliOptions cli;
  if (const auto code = parse_cli(argc, argv, cli, strategies, models)) return *code;
  return exit_code_of([&] { return run(cli, strategies, models); });
}

}  // namespace strata::bench
