#include "strata/callbacks/csv_logger.h"

#include "strata/core/atomic_file.h"

#include "strata/trainer/trainer.h"

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

/// The cells of one CSV line (RFC 4180 quotes undone).
std::vector<std::string> split_line(const std::string& line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else if (c != '\r') {
      cells.back() += c;
    }
  }
  return cells;
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

void CsvLogger::on_fit_start(Trainer& trainer, TrainingModule& module) {
  if (trainer.strategy().is_global_zero() && trainer.global_step() > 0) continue_file(trainer.global_step());
}

void CsvLogger::on_fit_end(Trainer& trainer, TrainingModule& module) {
  if (trainer.strategy().is_global_zero()) flush();
}

void CsvLogger::on_save_checkpoint(Trainer& trainer, const std::string& dir) {
  // A resume from this checkpoint continues the file from its rows.
  if (trainer.strategy().is_global_zero()) flush();
}

int64_t CsvLogger::continue_file(int64_t step) {
  const std::string target = path();
  std::ifstream in(target);
  if (!in) return 0;  // no earlier file: this one starts at step + 1
  std::string line;
  if (!std::getline(in, line)) return 0;
  std::vector<std::string> columns = split_line(line);
  TORCH_CHECK(!columns.empty() && columns[0] == "step", "CsvLogger: cannot continue '", target,
              "': its header '", line, "' does not start with 'step'");
  std::vector<std::vector<std::string>> rows;
  int64_t dropped = 0;
  for (int64_t number = 2; std::getline(in, line); ++number) {
    if (line.empty() || line == "\r") continue;
    auto cells = split_line(line);
    size_t used = 0;
    int64_t row_step = -1;
    try {
      row_step = std::stoll(cells[0], &used);
    } catch (const std::exception&) {
    }
    TORCH_CHECK(used == cells[0].size() && used > 0, "CsvLogger: cannot continue '", target, "': line ",
                number, " has step '", cells[0], "'");
    if (row_step > step) {
      ++dropped;
      continue;
    }
    cells.resize(std::min(cells.size(), columns.size()));
    rows.push_back(std::move(cells));
  }
  columns_ = columns;
  column_index_.clear();
  for (size_t c = 0; c < columns_.size(); ++c) column_index_.emplace(columns_[c], c);
  rows_ = std::move(rows);  // the file is the record of the run so far
  written_rows_ = rows_.size();
  // Later rows were dropped: rewrite the file now (atomically), so it never
  // shows the interrupted run's rows after this one's.
  written_columns_ = dropped > 0 ? 0 : columns_.size();
  if (dropped > 0) flush();
  return dropped;
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
