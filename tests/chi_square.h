// Pearson's chi-square for the statistical tests of sampling (kernels/candidates, sampler/): a
// histogram against expected probabilities, or two histograms of equal size against each other.
// Seeds are fixed, so a result never flickers; the bound is the chi-square quantile at z = 5
// (p ~ 3e-7, Wilson-Hilferty), generous enough that only a wrong distribution exceeds it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace anvil::testing {

struct chi_square_result {
  double statistic = 0;
  int dof = 0;
  double bound = 0;  // the statistic must stay below this
};

// The chi-square quantile for `dof` degrees of freedom at z standard deviations (Wilson-Hilferty).
inline double chi_square_bound(int dof, double z = 5.0) {
  const double d = dof, a = 2.0 / (9.0 * d);
  return d * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// counts[i] observed in bin i, probs[i] its expected probability (summing to 1). Bins expected to
// hold fewer than 5 draws are pooled into one, as the test's approximation needs.
inline chi_square_result chi_square(const std::vector<std::int64_t>& counts, const std::vector<double>& probs) {
  std::int64_t n = 0;
  for (auto c : counts) n += c;
  chi_square_result r;
  double pooled_obs = 0, pooled_exp = 0;
  int bins = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * double(n);
    if (e < 5) {
      pooled_obs += double(counts[i]);
      pooled_exp += e;
      continue;
    }
    r.statistic += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++bins;
  }
  if (pooled_exp > 0) {
    r.statistic += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
    ++bins;
  } else if (pooled_obs > 0) {
    r.statistic = INFINITY;  // draws where the distribution has no mass at all
  }
  r.dof = bins > 1 ? bins - 1 : 1;
  r.bound = chi_square_bound(r.dof);
  return r;
}

// Two histograms of the same number of draws: do they come from one distribution?
// Statistic sum (a - b)^2 / (a + b) over bins with a + b >= 10; the rest are pooled.
inline chi_square_result chi_square_two_sample(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) {
  chi_square_result r;
  double pa = 0, pb = 0;
  int bins = 0;
  auto add = [&](double x, double y) {
    if (x + y > 0) r.statistic += (x - y) * (x - y) / (x + y);
    ++bins;
  };
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] + b[i] < 10) {
      pa += double(a[i]);
      pb += double(b[i]);
    } else {
      add(double(a[i]), double(b[i]));
    }
  }
  if (pa + pb > 0) add(pa, pb);
  r.dof = bins > 1 ? bins - 1 : 1;
  r.bound = chi_square_bound(r.dof);
  return r;
}

}  // namespace anvil::testing
