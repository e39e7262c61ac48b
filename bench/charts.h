#pragma once
// Charts for strata-bench results, drawn by gnuplot (a subprocess): tokens/s
// and peak tensor memory per rank, each as a ratio to the reference strategy
// (StrategySpec::reference: ddp among the built-ins), one panel per
// variant (precision, activation checkpointing, offload), presets along the
// x axis, a colour per strategy -- readable at the README sweep's 64 cases.
// The per-rank split by category is in the Markdown report. The data (.dat) and the scripts (.gp) are always written beside
// the PNGs, so a machine without gnuplot still has what it needs to draw them.
//
//   ChartFiles f = write_charts(results, "out/");  // out/tokens_per_s.{dat,gp,png}, out/memory.{dat,gp,png}
//   if (!f.note.empty()) std::cerr << f.note;      // e.g. gnuplot missing
#include "strata/bench/harness.h"
#include "strata/strategies/registry.h"

#include <string>
#include <vector>

namespace strata::bench {

struct ChartFiles {
  std::vector<std::string> written;  ///< paths, data and scripts first, then PNGs drawn
  std::string note;                  ///< "" or why no PNG was drawn (one line)
};

/// What a chart shows per case: tokens/s (comparable_tokens_per_s) or the
/// peak tensor bytes per rank (max over ranks and runs).
enum class ChartMetric { kTokensPerS, kPeakTensorBytes };

/// A chart with one panel per variant (precision, activation checkpointing,
/// offload), a cluster per preset (and shape: world size, batch, block) and a
/// bar per strategy (in `strategies`' registration order, unknown ones
/// after), each bar the case's value divided by the reference strategy's in
/// the same cluster (a cluster without it: by its first strategy). Failed and
/// skipped cases are left out.
struct PanelChart {
  std::vector<std::string> panels;      ///< variant labels, in order of first appearance
  std::vector<std::string> strategies;  ///< bar order: the registry's, then others
  std::string data;                     ///< gnuplot data: one block (index) per panel
  bool long_labels = false;             ///< rows named by preset and shape (cases differ in shape)
  std::string ylabel = "ratio to the reference";  ///< what 1 (the dashed line) is
  double ymax = 0.0;  ///< the y axis' top (0: from the data); 1 shows the dashed line on a share chart
};
PanelChart panel_chart_data(const std::vector<CaseResult>& results, ChartMetric metric,
                            const StrategyRegistry& strategies);

/// The gnuplot script drawing `png` from `dat` (panel_chart_data's data):
/// multiplot, clustered histograms, a dashed line at 1 (= the reference).
std::string panel_chart_script(const PanelChart& chart, const std::string& dat, const std::string& png,
                               const std::string& terminal, const std::string& title);

/// A chart to draw: `name` gives the files' stem (NAME.dat, NAME.gp, NAME.png).
struct NamedChart {
  std::string name;
  PanelChart chart;
  std::string title;
};

/// Writes each chart's .dat and .gp files into `dir` and runs `gnuplot` on
/// them when it is on the PATH (pngcairo, else png terminal).
ChartFiles draw_charts(const std::vector<NamedChart>& charts, const std::string& dir,
                       const std::string& gnuplot = "gnuplot");

/// draw_charts of tokens_per_s and memory (panel_chart_data) over `results`,
/// the peer suite's cases left out (they compare systems, not strategies:
/// bench/peer_suite.h draws them); nothing when no case is left.
ChartFiles write_charts(const std::vector<CaseResult>& results, const std::string& dir,
                        const StrategyRegistry& strategies, const std::string& gnuplot = "gnuplot");

}  // namespace strata::bench
