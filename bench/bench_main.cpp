// strata-bench: sweeps strategies over GPT recipes by running strata-gpt once
// per case, prints Markdown tables, writes JSON lines, and gates regressions
// against a baseline (fairscale's --check_regression idea).
//
//   build/bin/strata-bench --suite zero,memory --json runs.jsonl --markdown report.md
//   build/bin/strata-bench --suite smoke --baseline bench/baselines/smoke.jsonl   # CI gate
//   build/bin/strata-bench --suite smoke --write-baseline bench/baselines/smoke.jsonl
//   build/bin/strata-bench --suite zero --from-json runs.jsonl    # re-render saved runs
//
// Exit codes: 0 ok, 1 a case failed or regressed, 2 bad input.
#include "bench/checkpoint_bench.h"
#include "bench/harness.h"
#include "bench/planner_suite.h"
#include "bench/report.h"

#include <boost/program_options.hpp>
#include <c10/util/Exception.h>

#include <unistd.h>

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
  std::string json_path, markdown_path, baseline_path, write_baseline_path, work_dir, from_json;
  bool keep_work_dir = false;
  bool list = false;
  double case_timeout_s = 600;
  GateOptions gate;
};

std::string default_gpt_binary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "strata-gpt" : (self.parent_path() / "strata-gpt").string();
}

void write_text(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path);
  out << text;
  TORCH_CHECK_VALUE(out.good(), flag, " file '", path, "' cannot be written");
}

/// Runs the cases in a work dir (progress on stderr, a JSON line per run to
/// `json` if open); nullopt after a failed case, which it reports.
std::optional<std::vector<CaseRun>> run_cases(const std::vector<BenchCase>& cases, RunOptions options,
                                              bool keep_work_dir, const ReportHeader& header, std::ofstream& json) {
  bool own_work_dir = false;
  if (options.work_dir.empty()) {
    std::string tmpl = (fs::temp_directory_path() / "strata-bench-XXXXXX").string();
    TORCH_CHECK(::mkdtemp(tmpl.data()) != nullptr, "cannot create a work directory from ", tmpl);
    options.work_dir = tmpl;
    own_work_dir = !keep_work_dir;
  } else {
    fs::create_directories(options.work_dir);
  }
  const size_t total = cases.size() * options.repeats;
  size_t done = 0;
  options.on_run = [&](const CaseRun& run) {
    const auto& s = run.summary;
    std::cerr << "[" << ++done << "/" << total << "] " << run.bench_case->name << " run " << run.repeat + 1 << "/"
              << options.repeats << ": " << static_cast<int64_t>(s.at("tokens_per_s").get<double>())
              << " tokens/s, peak " << format_mib(double(peak_tensor_bytes_max(s))) << "/rank, " << run.wall_s
              << " s" << std::endl;
    if (json.is_open()) json << run_record(run, header).dump() << std::endl;
  };
  std::cerr << "strata-bench: " << cases.size() << " case(s) x " << options.repeats << " repeat(s), "
            << options.gpt_binary << ", work dir " << options.work_dir << std::endl;
  try {
    auto runs = run_interleaved(cases, options);
    if (own_work_dir) fs::remove_all(options.work_dir);
    return runs;
  } catch (const CaseFailure& failure) {
    std::cerr << "error: " << failure.what() << "\n--- last lines of its output (work dir kept: " << options.work_dir
              << ") ---\n"
              << failure.output_tail() << std::flush;
    return std::nullopt;
  }
}

int run(const CliOptions& cli) {
  // ---- Everything that can be wrong with the input, before any case runs (exit 2). ----
  const std::vector<Suite> suites = select_suites(cli.suites);
  const std::vector<BenchCase> cases = all_cases(suites);
  bool only_smoke = true;
  for (const auto& s : suites) only_smoke &= s.name == "smoke";
  RunOptions run_options(cli.gpt.empty() ? default_gpt_binary() : cli.gpt, cli.work_dir);
  run_options.repeats = cli.repeats.value_or(only_smoke ? 1 : 3);
  run_options.case_timeout_s = cli.case_timeout_s;
  TORCH_CHECK_VALUE(run_options.repeats >= 1, "--repeats must be >= 1, got ", run_options.repeats);
  TORCH_CHECK_VALUE(cli.case_timeout_s > 0, "--case-timeout must be > 0 seconds, got ", cli.case_timeout_s);
  if (cli.list) {
    for (const auto& c : cases) {
      std::cout << c.name << "\n ";
      for (const auto& arg : gpt_command(c, run_options.gpt_binary, "<generated-text>", "<out>")) std::cout << " " << arg;
      std::cout << "\n";
    }
    return 0;
  }
  if (cli.from_json.empty())
    TORCH_CHECK_VALUE(::access(run_options.gpt_binary.c_str(), X_OK) == 0, "strata-gpt not found or not executable ",
                      "at '", run_options.gpt_binary, "'; build it (cmake --build build --target strata-gpt) or pass ",
                      "--gpt PATH");
  validate(cli.gate);
  std::map<std::string, BaselineEntry> baseline;
  if (!cli.baseline_path.empty()) baseline = read_baseline(cli.baseline_path);
  std::ofstream json;
  if (!cli.json_path.empty()) {
    json.open(cli.json_path);
    TORCH_CHECK_VALUE(json.good(), "--json file '", cli.json_path, "' cannot be written");
  }

  ReportHeader header;
  std::vector<CaseRun> runs;
  if (!cli.from_json.empty()) {
    runs = read_runs(cli.from_json, cases, &header);
    if (json.is_open())
      for (const auto& run : runs) json << run_record(run, header).dump() << "\n";
  } else {
    header.machine = machine_info();
    header.commit = git_commit(STRATA_SOURCE_DIR);
    header.date = utc_now();
    header.repeats = run_options.repeats;
    auto ran = run_cases(cases, run_options, cli.keep_work_dir, header, json);
    if (!ran) return 1;
    runs = std::move(*ran);
  }
  const std::vector<CaseResult> results = aggregate_runs(cases, runs);

  bool planner = false;
  for (const auto& s : suites) planner |= s.name == "planner";
  const std::string markdown = render_markdown(suites, results, header) + (planner ? planner_markdown(runs) : "");
  std::cout << markdown << std::flush;
  if (!cli.markdown_path.empty()) write_text(cli.markdown_path, markdown, "--markdown");
  if (!cli.write_baseline_path.empty()) {
    write_text(cli.write_baseline_path, baseline_text(results), "--write-baseline");
    std::cerr << "wrote baseline " << cli.write_baseline_path << " (" << results.size() << " cases)" << std::endl;
  }

  if (cli.baseline_path.empty()) return 0;
  for (const auto& r : results)
    if (!baseline.count(r.bench_case.name))
      std::cerr << "note: no baseline for case " << r.bench_case.name << " in " << cli.baseline_path
                << "; not gated" << std::endl;
  const auto regressions = compare_to_baseline(results, baseline, cli.gate);
  for (const auto& r : regressions) std::cerr << r.message() << std::endl;
  if (!regressions.empty()) return 1;
  std::cerr << "regression gate passed against " << cli.baseline_path << " (max slowdown "
            << cli.gate.max_slowdown * 100 << "%, max memory growth " << cli.gate.max_memory_growth * 100 << "%)"
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The checkpoint suite runs in-process on its own ranks (checkpoint_bench.h).
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--suite=checkpoint" || (a == "--suite" && i + 1 < argc && std::string(argv[i + 1]) == "checkpoint")) {
      return run_checkpoint_suite(argc, argv);
    }
  }
  CliOptions cli;
  int repeats = 0;
  po::options_description desc(
      "strata-bench: run strata-gpt over strategy/recipe suites and report throughput and memory\n"
      "Suites: single, ddp, zero, fsdp, memory, smoke, attention, kernels. Exit codes: 0 ok, 1 failure or regression, 2 bad input");
  desc.add_options()
      ("help,h", "show this help")
      ("suite", po::value(&cli.suites)->default_value(cli.suites), "comma-separated suites: single,ddp,zero,memory,smoke,attention; or checkpoint alone (checkpoint_bench.cpp)")
      ("repeats", po::value(&repeats), "runs per case, interleaved (default: 1 for smoke alone, else 3)")
      ("gpt", po::value(&cli.gpt), "strata-gpt binary (default: next to strata-bench)")
      ("json", po::value(&cli.json_path), "write one JSON line per run to FILE")
      ("markdown", po::value(&cli.markdown_path), "also write the Markdown report to FILE")
      ("baseline", po::value(&cli.baseline_path), "gate against this baseline (JSON lines); exit 1 on regression")
      ("write-baseline", po::value(&cli.write_baseline_path), "write the measured values as a baseline FILE")
      ("max-slowdown", po::value(&cli.gate.max_slowdown)->default_value(cli.gate.max_slowdown),
       "fail if median tokens/s < (1 - this) x baseline")
      ("max-memory-growth", po::value(&cli.gate.max_memory_growth)->default_value(cli.gate.max_memory_growth),
       "fail if peak tensor or model-state bytes > (1 + this) x baseline")
      ("case-timeout", po::value(&cli.case_timeout_s)->default_value(cli.case_timeout_s), "seconds per run")
      ("work-dir", po::value(&cli.work_dir), "keep outputs here (default: a temp dir, removed afterwards)")
      ("keep-work-dir", po::bool_switch(&cli.keep_work_dir), "do not remove the temp work dir")
      ("list", po::bool_switch(&cli.list), "print the cases and their strata-gpt commands, run nothing")
      ("from-json", po::value(&cli.from_json),
       "run nothing: report (and gate) the runs in FILE, a --json output, for the cases of --suite");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help")) {
      std::cout << desc << std::endl;
      return 0;
    }
    po::notify(vm);
    if (vm.count("repeats")) cli.repeats = repeats;
  } catch (const po::error& e) {
    std::cerr << "error: " << e.what() << "; see --help" << std::endl;
    return 2;
  }
  try {
    return run(cli);
  } catch (const c10::ValueError& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {  // e.g. an unparsable summary.json
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
