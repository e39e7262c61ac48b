#include "callbacks/csv_logger.h"

#include "core/atomic_file.h"

#include "trainer/trainer.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace strata {
namespace {

std::string format_number(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", value);
  return buf;
}

/// RFC 4180 quoting for keys that need it (numbers never do).
std::string quote(const std::string& cell) {
  if (cell.find_first_of(",\"\n\r") == std::string::npos) return cell;
  std::string out = "\"";
  for (char c : cell) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

CsvLogger::CsvLogger(CsvLoggerOptions options) : options_(std::move(options)) {
  TORCH_CHECK(!options_.dir().empty(), "CsvLogger: dir must not be empty");
  TORCH_CHECK(!options_.filename().empty(), "CsvLogger: filename must not be empty (dir '",
              options_.dir(), "')");
  TORCH_CHECK(options_.flush_every_n_rows() >= 1, "CsvLogger: flush_every_n_rows must be >= 1, got ",
              options_.flush_every_n_rows());
}

std::string CsvLogger::path() const {
  return (std::filesystem::path(options_.dir()) / options_.filename()).string();
}

void CsvLogger::on_log(Trainer& trainer, int64_t step, const LogRow& row) {
  if (trainer.strategy().is_global_zero()) add_row(step, row);
}

void CsvLogger::on_fit_end(Trainer& trainer, TrainingModule& module) {
  if (trainer.strategy().is_global_zero()) flush();
}

void CsvLogger::on_exception(Trainer& trainer, TrainingModule& module, const std::exception& error) {
  // Keep what was logged before the failure; never mask the original error.
  if (!trainer.strategy().is_global_zero()) return;
  try {
    flush();
  } catch (const std::exception&) {
  }
}

void CsvLogger::add_row(int64_t step, const LogRow& row) {
  std::vector<std::string> cells(columns_.size());
  cells[0] = std::to_string(step);
  for (const auto& [key, value] : row) {
    if (key == "step") continue;
    auto it = column_index_.find(key);
    if (it == column_index_.end()) {
      it = column_index_.emplace(key, columns_.size()).first;
      columns_.push_back(key);
      cells.resize(columns_.size());
    }
    cells[it->second] = format_number(value);  // a key logged twice keeps its last value
  }
  rows_.push_back(std::move(cells));
  if (rows_.size() - written_rows_ >= static_cast<size_t>(options_.flush_every_n_rows())) flush();
}

std::string CsvLogger::format_row(size_t index) const {
  const auto& cells = rows_[index];
  std::string line;
  for (size_t c = 0; c < columns_.size(); ++c) {
    if (c > 0) line += ',';
    if (c < cells.size()) line += cells[c];
  }
  return line;
}

void CsvLogger::flush() {
  if (rows_.size() == written_rows_ && columns_.size() == written_columns_) return;
  namespace fs = std::filesystem;
  const fs::path dir(options_.dir());
  const std::string target = path();
  fs::create_directories(dir);
  if (columns_.size() != written_columns_) {
    // The header changed (or there is no file yet): rewrite everything, through
    // a temporary so a crash mid-write leaves the previous file intact.
    write_file_atomically(target, [&](std::ostream& out) {
      for (size_t c = 0; c < columns_.size(); ++c) out << (c ? "," : "") << quote(columns_[c]);
      out << '\n';
      for (size_t r = 0; r < rows_.size(); ++r) out << format_row(r) << '\n';
    });
  } else {
    std::ofstream out(target, std::ios::app);
    TORCH_CHECK(out, "CsvLogger: cannot open '", target, "' for appending");
    for (size_t r = written_rows_; r < rows_.size(); ++r) out << format_row(r) << '\n';
    out.flush();
    TORCH_CHECK(out, "CsvLogger: appending rows ", written_rows_, "..", rows_.size(), " to '",
                target, "' failed");
  }
  written_rows_ = rows_.size();
  written_columns_ = columns_.size();
}

}  // namespace strata
