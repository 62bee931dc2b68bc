// A one-line progress bar of finished requests on stderr, mirroring cli/progress.h: redrawn in
// place on a terminal, a line per 10% otherwise (logs stay short).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <string>

namespace anvil::bench {

class request_progress {
 public:
  explicit request_progress(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO)) {}

  void update(std::size_t done, std::size_t total, std::size_t failed) {
    if (!enabled_) return;
    const int pct = total ? int(100.0 * double(done) / double(total)) : 100;
    if (!tty_) {
      if (pct / 10 > last_ / 10 || (pct == 100 && last_ != 100))
        std::fprintf(stderr, "requests: %zu/%zu (%zu failed)\n", done, total, failed);
      last_ = pct;
      return;
    }
    const int width = 30, filled = pct * width / 100;
    std::fprintf(stderr, "\rrequests [%s%s] %zu/%zu%s", std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total,
                 failed ? (" (" + std::to_string(failed) + " failed)").c_str() : "");
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
    last_ = pct;
  }

 private:
  bool enabled_;   // --no-progress turns it off
  bool tty_;       // stderr is a terminal: redraw in place
  int last_ = -1;  // last percentage shown
};

}  // namespace anvil::bench
