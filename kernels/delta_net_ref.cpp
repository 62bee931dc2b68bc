#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/delta_net.h"

namespace anvil::kernels {
namespace {

double silu(double x) { return x / (1.0 + std::exp(-x)); }

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

// x / sqrt(sum x^2 + 1e-6), in double.
void l2_normalize(const float* x, std::int64_t n, double scale, std::vector<double>& out) {
  double ss = 0;
  for (std::int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double r = scale / std::sqrt(ss + 1e-6);
  out.resize(std::size_t(n));
  for (std::int64_t i = 0; i < n; ++i) out[std::size_t(i)] = x[i] * r;
}

}  // namespace

void conv1d_silu_ref(const conv1d_silu_params& p) {
  const std::int64_t c_n = p.channels, kw = p.kernel, hist = kw - 1;
#pragma omp parallel for collapse(2) schedule(static)
  for (std::size_t s = 0; s < p.seqs.size(); ++s) {
    for (std::int64_t c = 0; c < c_n; ++c) {
      const recurrent_seq& q = p.seqs[s];
      float* st = p.state + std::int64_t(q.slot) * hist * c_n;
      double win[conv1d_max_taps];  // the inputs the current token's taps meet, oldest first
      for (std::int64_t j = 0; j < hist; ++j) win[j] = q.fresh ? 0.0 : st[j * c_n + c];
      const float* taps = p.taps + c * kw;
      for (std::int64_t t = 0; t < q.n_tokens; ++t) {
        float& x = p.x[(q.first + t) * c_n + c];
        win[hist] = x;
        double acc = 0;
        for (std::int64_t j = 0; j < kw; ++j) acc += double(taps[j]) * win[j];
        x = float(silu(acc));
        std::rotate(win, win + 1, win + kw);  // the oldest leaves
      }
      for (std::int64_t j = 0; j < hist; ++j) st[j * c_n + c] = float(win[j]);
    }
  }
}

void delta_rule_ref(const delta_rule_params& p) {
  const std::int64_t dk = p.head_k, dv = p.head_v, hv = p.v_heads, hk = p.k_heads;
  const std::int64_t width = 2 * hk * dk + hv * dv;
  const double q_scale = 1.0 / std::sqrt(double(dk));
#pragma omp parallel for collapse(2) schedule(static)
  for (std::size_t s = 0; s < p.seqs.size(); ++s) {
    for (std::int64_t j = 0; j < hv; ++j) {
      const recurrent_seq& sq = p.seqs[s];
      const std::int64_t kh = j % hk;
      float* S = p.state + (std::int64_t(sq.slot) * hv + j) * dk * dv;  // [dk][dv]
      if (sq.fresh) std::fill(S, S + dk * dv, 0.f);
      std::vector<double> q, k, o(static_cast<std::size_t>(dv)), d(static_cast<std::size_t>(dv));
      for (std::int64_t t = 0; t < sq.n_tokens; ++t) {
        const std::int64_t row = sq.first + t;
        const float* r = p.qkv + row * width;
        l2_normalize(r + kh * dk, dk, q_scale, q);
        l2_normalize(r + hk * dk + kh * dk, dk, 1.0, k);
        const float* v = r + 2 * hk * dk + j * dv;
        const double beta = 1.0 / (1.0 + std::exp(-double(p.b[row * hv + j])));
        const double g = double(p.a[j]) * softplus(double(p.alpha[row * hv + j]) + p.dt_bias[j]);
        const float decay = float(std::exp(g));
        for (std::int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
        // d = beta (v - S^T k), then S += k d^T, then o = S^T q.
        std::fill(d.begin(), d.end(), 0.0);
        for (std::int64_t a = 0; a < dk; ++a) {
          for (std::int64_t c = 0; c < dv; ++c) d[std::size_t(c)] += double(S[a * dv + c]) * k[std::size_t(a)];
        }
        for (std::int64_t c = 0; c < dv; ++c) d[std::size_t(c)] = beta * (double(v[c]) - d[std::size_t(c)]);
        std::fill(o.begin(), o.end(), 0.0);
        for (std::int64_t a = 0; a < dk; ++a) {
          for (std::int64_t c = 0; c < dv; ++c) {
            S[a * dv + c] = float(double(S[a * dv + c]) + k[std::size_t(a)] * d[std::size_t(c)]);
            o[std::size_t(c)] += double(S[a * dv + c]) * q[std::size_t(a)];
          }
        }
        double ms = 0;
        for (double x : o) ms += x * x;
        const double inv = 1.0 / std::sqrt(ms / double(dv) + p.eps);
        const float* z = p.z + row * hv * dv + j * dv;
        float* y = p.y + row * hv * dv + j * dv;
        for (std::int64_t c = 0; c < dv; ++c) y[c] = float(o[std::size_t(c)] * inv * p.norm[c] * silu(z[c]));
      }
    }
  }
}

}  // namespace anvil::kernels
