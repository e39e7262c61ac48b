#include "bench/charts.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace strata::bench {
namespace fs = std::filesystem;

namespace {

/// The case name without its suite: "gpt-mini/fsdp-2x1".
std::string label(const CaseResult& r) {
  const std::string& n = r.bench_case.name;
  const auto slash = n.find('/');
  return slash == std::string::npos ? n : n.substr(slash + 1);
}

double mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

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

std::string tokens_chart_data(const std::vector<CaseResult>& results) {
  std::ostringstream out;
  out << "# case median_tokens_per_s min max (all ranks, over repeats)\n";
  for (const auto& r : results) {
    if (r.runs == 0) continue;
    out << '"' << label(r) << "\" " << r.tokens_per_s.median << " " << r.tokens_per_s.min << " "
        << r.tokens_per_s.max << "\n";
  }
  return out.str();
}

std::string memory_chart_data(const std::vector<CaseResult>& results) {
  std::ostringstream out;
  out << "# case/rank params grads optimizer activations_other (MiB, at the rank's peak)\n";
  for (const auto& r : results) {
    if (r.runs == 0) continue;
    for (const RankResult& k : r.ranks) {
      out << '"' << label(r) << " r" << k.rank << "\" " << mib(k.params.value_or(0)) << " "
          << mib(k.grads.value_or(0)) << " " << mib(k.optimizer.value_or(0)) << " "
          << mib(k.activations_other.value_or(0)) << "\n";
    }
  }
  return out.str();
}

std::string tokens_chart_script(const std::string& dat, const std::string& png, const std::string& terminal) {
  std::ostringstream out;
  out << "set terminal " << terminal << " size 1400,700 font ',10'\n"
      << "set output '" << png << "'\n"
      << "set title 'tokens/s per case (all ranks; bar: median, whiskers: min-max over repeats)'\n"
      << "set style data histograms\n"
      << "set style histogram errorbars gap 1 lw 1\n"
      << "set style fill solid 0.7 border -1\n"
      << "set boxwidth 0.8\n"
      << "set ylabel 'tokens/s'\n"
      << "set yrange [0:*]\n"
      << "set grid ytics\n"
      << "set key off\n"
      << "set xtics rotate by -40 scale 0 font ',8'\n"
      << "set bmargin 14\n"
      << "plot '" << dat << "' using 2:3:4:xtic(1) lc rgb '#4477aa'\n";
  return out.str();
}

std::string memory_chart_script(const std::string& dat, const std::string& png, const std::string& terminal) {
  std::ostringstream out;
  out << "set terminal " << terminal << " size 1400,700 font ',10'\n"
      << "set output '" << png << "'\n"
      << "set title 'tensor memory per rank at its peak, by category (MiB)'\n"
      << "set style data histograms\n"
      << "set style histogram rowstacked\n"
      << "set style fill solid 0.8 border -1\n"
      << "set boxwidth 0.8\n"
      << "set ylabel 'MiB'\n"
      << "set yrange [0:*]\n"
      << "set grid ytics\n"
      << "set key outside right top\n"
      << "set xtics rotate by -40 scale 0 font ',8'\n"
      << "set bmargin 14\n"
      << "plot '" << dat << "' using 2:xtic(1) title 'params' lc rgb '#4477aa', "
      << "'' using 3 title 'grads' lc rgb '#ee6677', '' using 4 title 'optimizer' lc rgb '#228833', "
      << "'' using 5 title 'activations+other' lc rgb '#ccbb44'\n";
  return out.str();
}

ChartFiles write_charts(const std::vector<CaseResult>& results, const std::string& dir, const std::string& gnuplot) {
  ChartFiles files;
  const fs::path d(dir);
  fs::create_directories(d);
  std::string terminals;
  const bool have_gnuplot =
      capture("echo 'set terminal' | " + quote(gnuplot) + " 2>&1", &terminals) == 0 && !terminals.empty();
  const std::string terminal = terminals.find("pngcairo") != std::string::npos ? "pngcairo" : "png";
  struct Chart {
    const char* name;
    std::string data;
    std::string (*script)(const std::string&, const std::string&, const std::string&);
  };
  const Chart charts[] = {{"tokens_per_s", tokens_chart_data(results), tokens_chart_script},
                          {"memory", memory_chart_data(results), memory_chart_script}};
  std::vector<std::string> scripts;
  for (const Chart& c : charts) {
    const fs::path dat = d / (std::string(c.name) + ".dat"), gp = d / (std::string(c.name) + ".gp"),
                   png = d / (std::string(c.name) + ".png");
    write_file(dat, c.data);
    // Relative names: the script runs in `dir`, so the folder can be moved and re-drawn.
    write_file(gp, c.script(dat.filename().string(), png.filename().string(), terminal));
    files.written.push_back(dat.string());
    files.written.push_back(gp.string());
    scripts.push_back(gp.filename().string());
  }
  if (!have_gnuplot) {
    files.note = "gnuplot not found ('" + gnuplot + "'): wrote the chart data and scripts to " + dir +
                 " but no PNG (install gnuplot-nox, then run: cd " + dir + " && gnuplot tokens_per_s.gp memory.gp)";
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

}  // namespace strata::bench
