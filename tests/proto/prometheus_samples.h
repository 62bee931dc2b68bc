// Prometheus text → its samples, for the metrics tests: "name{labels}" → value.
#pragma once

#include <map>
#include <sstream>
#include <string>

namespace anvil::testing {

inline std::map<std::string, double> prometheus_samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t sp = line.rfind(' ');
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

}  // namespace anvil::testing
