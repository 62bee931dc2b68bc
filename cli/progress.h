// A one-line progress bar on stderr (only when stderr is a terminal, else a line per 10%). It
// counts bytes (shown in GB) or, given a unit name, plain items ("12/40 windows").
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace anvil::cli {

class progress_bar {
 public:
  explicit progress_bar(std::string label, std::string unit = {})
      : label_(std::move(label)), unit_(std::move(unit)), tty_(isatty(STDERR_FILENO)) {}

  void update(std::size_t done, std::size_t total) {
    const int pct = total ? int(100.0 * double(done) / double(total)) : 100;
    if (!tty_) {
      if (pct / 10 > last_ / 10 || (pct == 100 && last_ != 100)) std::fprintf(stderr, "%s: %d%%\n", label_.c_str(), pct);
      last_ = pct;
      return;
    }
    const int width = 30, filled = pct * width / 100;
    std::fprintf(stderr, "\r%s [%s%s] %3d%% ", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), pct);
    if (unit_.empty()) {
      std::fprintf(stderr, "%.2f/%.2f GB", double(done) / 1e9, double(total) / 1e9);
    } else {
      std::fprintf(stderr, "%zu/%zu %s", done, total, unit_.c_str());
    }
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
    last_ = pct;
  }

 private:
  std::string label_;
  std::string unit_;  // empty: bytes
  bool tty_;
  int last_ = -1;
};

}  // namespace anvil::cli
