#pragma once
// CsvLogger: <dir>/metrics.csv like Lightning's CSVLogger (rank 0 only).
//
// One row per on_log call: a "step" column first, then the union of every key
// logged so far in order of first appearance; a row lacks the keys it was not
// given (empty cells). Keys can appear late (val_loss only at validation
// steps), so every row is kept in memory: a flush appends the new rows while
// the header is unchanged and rewrites the whole file (through a temporary
// file and a rename) when new keys appeared, as Lightning does. Flushes every
// flush_every_n_rows rows, when a checkpoint is saved (so the file holds every
// row up to it), at fit end and when fit() fails.
//
// A resumed fit (global step k > 0 at on_fit_start) continues the file it
// finds: rows up to step k are kept, rows after k (an interrupted run's, which
// the resumed run repeats) are dropped, and new rows are appended under the
// same header, so the file reads as one run.
//
// Example:
//   trainer callbacks: std::make_shared<strata::CsvLogger>(strata::CsvLoggerOptions("runs/gpt"))
//   -> runs/gpt/metrics.csv
//      step,loss,lr,tokens_per_s,val_loss
//      10,3.2113,0.001,12345,
//      20,2.9821,0.001,12401,2.9950
#include "strata/trainer/callback.h"

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace strata {

struct CsvLoggerOptions {
  /// Directory of the file; created if needed.
  explicit CsvLoggerOptions(std::string dir) : dir_(std::move(dir)) {}
  TORCH_ARG(std::string, dir);
  TORCH_ARG(std::string, filename) = "metrics.csv";
  /// Write to disk every n rows (Lightning's flush_logs_every_n_steps).
  TORCH_ARG(int64_t, flush_every_n_rows) = 100;
};

class CsvLogger : public Callback {
 public:
  explicit CsvLogger(CsvLoggerOptions options);

  std::string name() const override { return "CsvLogger"; }

  void on_log(Trainer& trainer, int64_t step, const LogRow& row) override;
  void on_fit_start(Trainer& trainer, TrainingModule& module) override;
  void on_fit_end(Trainer& trainer, TrainingModule& module) override;
  void on_save_checkpoint(Trainer& trainer, const std::string& dir) override;
  void on_exception(Trainer& trainer, TrainingModule& module, const std::exception& error) override;

  /// Records one row (what on_log does on rank 0); flushes every n rows.
  void add_row(int64_t step, const LogRow& row);
  /// Writes the rows not yet on disk (or the whole file if the header grew).
  void flush();
  /// Continues the file on disk (if any) for a fit resumed after `step`: its
  /// header and rows up to `step` become this logger's, as already written;
  /// the file is rewritten (atomically) when it held later rows. Returns the
  /// number of rows dropped.
  int64_t continue_file(int64_t step);

  /// <dir>/<filename>
  std::string path() const;
  /// "step" followed by every key seen, in order of first appearance.
  const std::vector<std::string>& columns() const { return columns_; }
  int64_t num_rows() const { return static_cast<int64_t>(rows_.size()); }

 private:
  /// One line of cells, in columns_ order (missing trailing cells are empty).
  std::string format_row(size_t index) const;

  CsvLoggerOptions options_;
  std::vector<std::string> columns_{"step"};
  std::unordered_map<std::string, size_t> column_index_{{"step", 0}};
  /// Per row: one cell per column known when it was added ("" = missing).
  std::vector<std::vector<std::string>> rows_;
  size_t written_rows_ = 0;
  size_t written_columns_ = 0;  ///< header width of the file on disk; 0 = no file yet
};

}  // namespace strata
