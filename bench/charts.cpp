#include "strata/bench/charts.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata::bench {
namespace fs = std::filesystem;

namespace {

/// Output of a shell command and its exit status.
int capture(const std::string& command, std::string* out) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buf[256];
  while (std::fgets(buf, sizeof(buf), pipe)) *out += buf;
  const int status = ::pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  TORCH_CHECK(out.good(), "cannot write ", path.string());
}

}  // namespace

namespace {

/// What sets a case apart from its strategy within a preset: precision,
/// activation checkpointing and offload ("fp32", "bf16 + ac1", "fp32 + offload disk").
std::string variant_of(const BenchCase& c) {
  std::string v = c.precision == "bf16-mixed" || c.precision == "bf16" ? "bf16" : "fp32";
  for (size_t i = 0; i + 1 < c.extra.size(); ++i) {
    if (c.extra[i] == "--activation-checkpointing" && c.extra[i + 1] != "0") v += " + ac" + c.extra[i + 1];
    if (c.extra[i] == "--offload" && c.extra[i + 1] != "none") v += " + offload " + c.extra[i + 1];
  }
  return v;
}

/// The rest of a case's shape, which a ratio must hold fixed: world size,
/// threads, batch, block, the model's flags (a width), and any other flag (a
/// kernel choice).
std::string shape_of(const BenchCase& c) {
  std::string shape = std::to_string(c.nproc) + "x" + std::to_string(c.threads_per_rank) + " b" +
                      std::to_string(c.batch_size) + " t" + std::to_string(c.block_size);
  for (const auto& f : c.model_flags) shape += " " + f;
  for (size_t i = 0; i < c.extra.size(); ++i) {
    const bool variant_flag = c.extra[i] == "--activation-checkpointing" || c.extra[i] == "--offload";
    if (variant_flag) {
      ++i;  // its value
      continue;
    }
    shape += " " + c.extra[i];
  }
  return shape;
}


/// A cell's value for `metric`; nullopt when unknown.
std::optional<double> metric_of(const CaseResult& r, ChartMetric metric) {
  if (metric == ChartMetric::kTokensPerS) {
    const double v = comparable_tokens_per_s(r);
    return v > 0 ? std::optional<double>(v) : std::nullopt;
  }
  return r.peak_tensor_bytes_max > 0 ? std::optional<double>(double(r.peak_tensor_bytes_max)) : std::nullopt;
}

}  // namespace

PanelChart panel_chart_data(const std::vector<CaseResult>& results, ChartMetric metric,
                            const StrategyRegistry& strategies) {
  PanelChart chart;
  const std::string reference = strategies.reference() ? strategies.reference()->name() : "";
  chart.ylabel = "ratio to " + (reference.empty() ? std::string("the first strategy") : reference);
  // (variant, preset, shape) -> strategy -> value; the order of first appearance.
  std::map<std::tuple<std::string, std::string, std::string>, std::map<std::string, double>> cells;
  for (const auto& r : results) {
    if (r.runs == 0 || r.status != "ok") continue;
    const auto value = metric_of(r, metric);
    if (!value) continue;
    const BenchCase& c = r.bench_case;
    const std::string variant = variant_of(c);
    if (std::find(chart.panels.begin(), chart.panels.end(), variant) == chart.panels.end()) chart.panels.push_back(variant);
    if (std::find(chart.strategies.begin(), chart.strategies.end(), c.strategy) == chart.strategies.end())
      chart.strategies.push_back(c.strategy);
    cells[{variant, c.preset, shape_of(c)}][c.strategy] = *value;
  }
  // Bars in the registry's order (so a strategy keeps its colour), others after.
  std::vector<std::string> ordered;
  for (const auto* spec : strategies.specs()) {
    const std::string& s = spec->name();
    if (std::find(chart.strategies.begin(), chart.strategies.end(), s) != chart.strategies.end()) ordered.push_back(s);
  }
  for (const auto& s : chart.strategies)
    if (std::find(ordered.begin(), ordered.end(), s) == ordered.end()) ordered.push_back(s);
  chart.strategies = ordered;
  // Rows are named by preset alone when every case has the same shape.
  std::set<std::string> shapes;
  for (const auto& [key, unused] : cells) shapes.insert(std::get<2>(key));
  const bool one_shape = shapes.size() <= 1;
  chart.long_labels = !one_shape;
  std::ostringstream out;
  if (one_shape && !shapes.empty()) out << "# every case: " << *shapes.begin() << "\n";
  out << "# one block per panel (variant); rows: preset (and shape); columns: each strategy's "
      << (metric == ChartMetric::kTokensPerS ? "tokens/s" : "peak tensor bytes per rank")
      << " divided by " << reference << "'s in the same row ('?' = no such case; a row without " << reference
      << " is divided by its first strategy)\n";
  for (size_t p = 0; p < chart.panels.size(); ++p) {
    if (p > 0) out << "\n\n";
    out << "# panel " << p << ": " << chart.panels[p] << "\n\"preset\"";
    for (const auto& s : chart.strategies) out << " \"" << s << "\"";
    out << "\n";
    for (const auto& [key, by_strategy] : cells) {
      if (std::get<0>(key) != chart.panels[p]) continue;
      const auto ref = by_strategy.find(reference);
      double base = ref != by_strategy.end() ? ref->second : 0.0;
      for (const auto& s : chart.strategies) {
        if (base > 0) break;
        if (const auto it = by_strategy.find(s); it != by_strategy.end()) base = it->second;
      }
      out << '"' << std::get<1>(key) << (one_shape ? "" : " (" + std::get<2>(key) + ")") << '"';
      for (const auto& s : chart.strategies) {
        const auto it = by_strategy.find(s);
        if (it == by_strategy.end() || base <= 0) {
          out << " ?";
        } else {
          out << " " << it->second / base;
        }
      }
      out << "\n";
    }
  }
  chart.data = out.str();
  return chart;
}

namespace {

/// `text` inside a gnuplot single-quoted string: a quote is written twice.
std::string gnuplot_quoted(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out;
}

}  // namespace

std::string panel_chart_script(const PanelChart& chart, const std::string& dat, const std::string& png,
                               const std::string& terminal, const std::string& title) {
  const size_t panels = std::max<size_t>(1, chart.panels.size());
  const size_t cols = std::min<size_t>(panels, 4), rows = (panels + cols - 1) / cols;
  static const char* palette = "#4477aa #ee6677 #228833 #ccbb44 #66ccee #aa3377 #bbbbbb";
  std::ostringstream out;
  out << "set terminal " << terminal << " size " << (chart.long_labels ? 480 : 380) * cols << ","
      << (chart.long_labels ? 420 : 320) * rows + 110 << " font ',10'\n"
      << "set output '" << png << "'\n"
      << "set datafile missing '?'\n"
      << "set style data histograms\n"
      << "set style histogram clustered gap 1\n"
      << "set style fill solid 0.85 border -1\n"
      << "set boxwidth 0.9\n"
      << "set yrange [0:" << (chart.ymax > 0 ? c10::str(chart.ymax) : std::string("*")) << "]\n"
      << "set grid ytics\n"
      << (chart.long_labels ? "set xtics scale 0 font ',8' rotate by -35\n" : "set xtics scale 0 font ',9'\n")
      << "set ylabel '" << gnuplot_quoted(chart.ylabel) << "'\n"
      << "colors = '" << palette << "'\n"
      << "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead dt 2 lc rgb '#555555'\n"
      // The legend once, between the title and the panels.
      << "set multiplot layout " << rows << "," << cols << " title '" << gnuplot_quoted(title) << "' margins 0.07,0.98,"
      << (chart.long_labels ? "0.2" : "0.07") << ",0.76 spacing 0.07,0.14\n";  // the legend above, clear of the panel titles
  const size_t columns = chart.strategies.size() + 1;
  for (size_t p = 0; p < chart.panels.size(); ++p) {
    out << "set title '" << gnuplot_quoted(chart.panels[p]) << "'\n";
    out << (p == 0 ? "set key at screen 0.5, screen 0.935 center top horizontal maxrows 1 font ',9'\n" : "unset key\n");
    out << "plot for [i=2:" << columns << "] '" << dat << "' index " << p
        << " using i:xtic(1) title columnheader(i) lc rgb word(colors, i-1)\n";
  }
  out << "unset multiplot\n";
  return out.str();
}

ChartFiles draw_charts(const std::vector<NamedChart>& charts, const std::string& dir, const std::string& gnuplot) {
  ChartFiles files;
  const fs::path d(dir);
  fs::create_directories(d);
  std::string terminals;
  const bool have_gnuplot =
      capture("echo 'set terminal' | " + quote(gnuplot) + " 2>&1", &terminals) == 0 && !terminals.empty();
  const std::string terminal = terminals.find("pngcairo") != std::string::npos ? "pngcairo" : "png";
  std::vector<std::string> scripts;
  for (const NamedChart& c : charts) {
    const fs::path dat = d / (c.name + ".dat"), gp = d / (c.name + ".gp"), png = d / (c.name + ".png");
    write_file(dat, c.chart.data);
    // Relative names: the script runs in `dir`, so the folder can be moved and re-drawn.
    write_file(gp, panel_chart_script(c.chart, dat.filename().string(), png.filename().string(), terminal, c.title));
    files.written.push_back(dat.string());
    files.written.push_back(gp.string());
    scripts.push_back(gp.filename().string());
  }
  if (!have_gnuplot) {
    std::string all;
    for (const auto& gp : scripts) all += " " + gp;
    files.note = "gnuplot not found ('" + gnuplot + "'): wrote the chart data and scripts to " + dir +
                 " but no PNG (install gnuplot-nox, then run: cd " + dir + " && gnuplot" + all + ")";
    return files;
  }
  for (const auto& gp : scripts) {
    std::string output;
    const int rc = capture("cd " + quote(dir) + " && " + quote(gnuplot) + " " + quote(gp) + " 2>&1", &output);
    const fs::path png = d / (gp.substr(0, gp.size() - 3) + ".png");
    if (rc != 0 || !fs::exists(png)) {
      files.note = "gnuplot failed on " + (d / gp).string() + ": " + output.substr(0, output.find('\n'));
      continue;
    }
    files.written.push_back(png.string());
  }
  return files;
}

ChartFiles write_charts(const std::vector<CaseResult>& results, const std::string& dir,
                        const StrategyRegistry& strategies, const std::string& gnuplot) {
  std::vector<CaseResult> cases;
  for (const auto& r : results)
    if (r.bench_case.suite != "peer") cases.push_back(r);
  if (cases.empty()) return {};  // a peer-only run: nothing to draw here
  const std::string reference = strategies.reference() ? strategies.reference()->name() : "the first strategy";
  return draw_charts({{"tokens_per_s", panel_chart_data(cases, ChartMetric::kTokensPerS, strategies),
                       "tokens/s (best step, all ranks) as a ratio to " + reference + ": higher is faster"},
                      {"memory", panel_chart_data(cases, ChartMetric::kPeakTensorBytes, strategies),
                       "peak tensor memory per rank as a ratio to " + reference + ": lower is smaller"}},
                     dir, gnuplot);
}

}  // namespace strata::bench
