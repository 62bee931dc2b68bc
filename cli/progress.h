// A one-line progress bar on stderr (only when stderr is a terminal, else a line per 10%).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace anvil::cli {

class progress_bar {
 public:
  explicit progress_bar(std::string label) : label_(std::move(label)), tty_(isatty(STDERR_FILENO)) {}

  void update(std::size_t done, std::size_t total) {
    const int pct = total ? int(100.0 * double(done) / double(total)) : 100;
    if (!tty_) {
      if (pct / 10 > last_ / 10 || (pct == 100 && last_ != 100)) std::fprintf(stderr, "%s: %d%%\n", label_.c_str(), pct);
      last_ = pct;
      return;
    }
    const int width = 30, filled = pct * width / 100;
    std::fprintf(stderr, "\r%s [%s%s] %3d%% %.2f/%.2f GB", label_.c_str(), std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), pct, double(done) / 1e9, double(total) / 1e9);
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
    last_ = pct;
  }

 private:
  std::string label_;
  bool tty_;
  int last_ = -1;
};

}  // namespace anvil::cli
