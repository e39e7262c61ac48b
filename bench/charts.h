#pragma once
// Charts for strata-bench results, drawn by gnuplot (a subprocess): tokens/s
// per case (median, min–max whiskers over repeats) and per-rank memory at the
// peak, stacked by category (params, grads, optimizer, activations+other),
// per case. The data (.dat) and the scripts (.gp) are always written beside
// the PNGs, so a machine without gnuplot still has what it needs to draw them.
//
//   ChartFiles f = write_charts(results, "out/");  // out/tokens_per_s.{dat,gp,png}, out/memory.{dat,gp,png}
//   if (!f.note.empty()) std::cerr << f.note;      // e.g. gnuplot missing
#include "bench/harness.h"

#include <string>
#include <vector>

namespace strata::bench {

struct ChartFiles {
  std::vector<std::string> written;  ///< paths, data and scripts first, then PNGs drawn
  std::string note;                  ///< "" or why no PNG was drawn (one line)
};

/// The gnuplot script that draws `png` from `dat` (tokens/s bars).
std::string tokens_chart_script(const std::string& dat, const std::string& png, const std::string& terminal);
/// The gnuplot script for the stacked per-rank memory chart.
std::string memory_chart_script(const std::string& dat, const std::string& png, const std::string& terminal);

/// Data files for the two charts: one line per case ("label" median min max),
/// one per case and rank ("label r<k>" params grads optimizer other, MiB).
/// Failed and skipped cases are left out.
std::string tokens_chart_data(const std::vector<CaseResult>& results);
std::string memory_chart_data(const std::vector<CaseResult>& results);

/// Writes the .dat and .gp files into `dir` and runs `gnuplot` on them when
/// it is on the PATH (pngcairo, else png terminal).
ChartFiles write_charts(const std::vector<CaseResult>& results, const std::string& dir,
                        const std::string& gnuplot = "gnuplot");

}  // namespace strata::bench
