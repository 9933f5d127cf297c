// Greedy tokens from an LM head without the float32 product over the whole vocabulary.
//
// A greedy row needs only the index of its largest logit. The float32 logits come from the packed
// linear kernel (cpu_linear.h), where each one is a single FMA chain in k order from zero, so any
// one of them can be recomputed alone, bit for bit. kernels/greedy_cpu.py first computes every
// logit cheaply (bfloat16 operands, float32 sums: the packed bfloat16 kernel) and passes that
// estimate `a` here, with a bound on how far each estimate can be from the float32 logit f:
//
//     |a_v - f_v| <= b_v = coef * |x| * |w_v| + t    (Euclidean norms; coef from the formats)
//
// where t covers what the bfloat16 instructions flush to zero (see `flush_slack`). The largest
// f_v is then among the candidates, the v with a_v + b_v >= max_u (a_u - b_u): for the winner v*,
// a_v* + b_v* >= f_v* >= f_u >= a_u - b_u for every u. Only the candidates (a few per row with a
// trained model's logits) are computed in float32, with the kernel's arithmetic, and the largest
// wins, the lowest index among equals: torch.argmax's answer on the full row.
//
// A row comes back as -1 when it cannot be decided this way (a non-finite estimate or norm, or
// more than max_candidates candidates): the caller computes that row's full logits.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace greedy {

// The float32 logits of columns v[0 .. n) (n <= 8) of a weight packed as [P, K, panel] for the
// row x: the packed kernel's FMA chains (from zero, k in order; its k slices keep the running sum
// in float32), side by side.
inline void exact_logits(const float* x, const float* packed, int64_t K, int64_t panel, const int64_t* v, int64_t n,
                         float* out) {
  const float* w[8];
  float acc[8];
  for (int64_t j = 0; j < n; ++j) w[j] = packed + (v[j] / panel) * K * panel + v[j] % panel, acc[j] = 0.f;
  constexpr int64_t kAhead = 16;  // k steps ahead that a column's line is asked for
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < n; ++j) {
      if (k + kAhead < K) __builtin_prefetch(w[j] + (k + kAhead) * panel);
      acc[j] = std::fma(x[k], w[j][k * panel], acc[j]);
    }
  }
  for (int64_t j = 0; j < n; ++j) out[j] = acc[j];
}

// The same chains read from the weight's rows ([V, K] row-major, the unpacked head: an embedding
// table the head is tied to), K contiguous floats a column instead of one line per k: the same
// bits (one FMA chain in k order from zero).
inline void exact_logits_rows(const float* x, const float* rows, int64_t K, const int64_t* v, int64_t n, float* out) {
  const float* w[8];
  float acc[8];
  for (int64_t j = 0; j < n; ++j) w[j] = rows + v[j] * K, acc[j] = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0; j < n; ++j) acc[j] = std::fma(x[k], w[j][k], acc[j]);
  }
  for (int64_t j = 0; j < n; ++j) out[j] = acc[j];
}

// The absolute part t of the bound: AVX512-BF16's conversion and dot products treat bfloat16
// subnormals (magnitudes below 2^-126) as zero and flush subnormal results to zero. A flushed
// x_k costs at most 2^-126 |w_k|, a flushed weight 2^-126 |x_k|, each flushed product or partial
// sum at most 2^-126 (2K of them): in all at most 2^-126 (K max|w| + sum |x_k| + 2K), with
// max|w| <= the largest row norm. Doubled, and never below 1e-30.
inline double flush_slack(double l1, int64_t K, double max_norm) {
  return std::max(1e-30, 0x1p-125 * (static_cast<double>(K) * (max_norm + 2.0) + l1));
}

inline int64_t pick(const float* hi, float lo, const float* x, const float* packed, const float* rows, int64_t V,
                    int64_t K, int64_t panel, int64_t max_candidates, std::vector<int64_t>& candidates);

// One row: the token, or -1 (see the top of this file); `est` the row's estimates, `hi` scratch
// for each estimate plus its bound (V floats).
inline int64_t row_token(const float* est, const float* x, const float* packed, const float* rows, const float* norms,
                         double max_norm,
                         int64_t V, int64_t K, int64_t panel, double coef, int64_t max_candidates, float* hi,
                         std::vector<int64_t>& candidates) {
  double sq = 0.0, l1 = 0.0;
  for (int64_t k = 0; k < K; ++k) sq += static_cast<double>(x[k]) * x[k], l1 += std::fabs(static_cast<double>(x[k]));
  // |x| rounded up; the bound's scale in float32, with room for the float32 sums below: each of
  // a_v +- b_v and the comparisons is one rounding (2^-24 relative), covered by the 2^-10 and the
  // 2^-20 * |a_v| added to every b_v.
  const double scale = coef * std::sqrt(sq) * (1.0 + 1e-6) * (1.0 + 0x1p-10);
  if (!std::isfinite(scale) || scale > 1e30) return -1;
  const float s = static_cast<float>(scale);
  const double slack = flush_slack(l1, K, max_norm);
  if (!(slack < 1e30)) return -1;
  const float kTiny = static_cast<float>(slack * (1.0 + 0x1p-10));
  float lo = -std::numeric_limits<float>::infinity();
  float bad = 0.f;  // NaN where an estimate is not finite
  int64_t v = 0;
#if defined(__AVX512F__) && !defined(BATCHGEN_EMULATE_AVX512) && !defined(BATCHGEN_TILE16_HALVES)
  {
    __m512 vlo = _mm512_set1_ps(lo), vbad = _mm512_setzero_ps();
    const __m512 vs = _mm512_set1_ps(s), eps = _mm512_set1_ps(0x1p-20f), tiny = _mm512_set1_ps(kTiny);
    for (; v + 16 <= V; v += 16) {
      const __m512 e = _mm512_loadu_ps(est + v);
      vbad = _mm512_add_ps(vbad, _mm512_mul_ps(e, _mm512_setzero_ps()));
      const __m512 b = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(vs, _mm512_loadu_ps(norms + v)),
                                                   _mm512_mul_ps(_mm512_abs_ps(e), eps)), tiny);
      vlo = _mm512_max_ps(vlo, _mm512_sub_ps(e, b));
      _mm512_storeu_ps(hi + v, _mm512_add_ps(e, b));
    }
    lo = _mm512_reduce_max_ps(vlo);
    bad = _mm512_reduce_add_ps(vbad);
  }
#endif
  for (; v < V; ++v) {
    const float e = est[v];
    bad += e * 0.f;
    const float b = s * norms[v] + std::fabs(e) * 0x1p-20f + kTiny;
    lo = std::max(lo, e - b);
    hi[v] = e + b;
  }
  if (!(bad == 0.f)) return -1;
  return pick(hi, lo, x, packed, rows, V, K, panel, max_candidates, candidates);
}

// The row's token from each estimate plus its bound (`hi`, V floats) and the largest estimate
// minus its bound (`lo`): the candidates (hi >= lo) computed in float32 with the packed kernel's
// chains (from `rows`, the row-major weight, where not null), the largest, the lowest index among
// equals; -1 past max_candidates or for a NaN.
inline int64_t pick(const float* hi, float lo, const float* x, const float* packed, const float* rows, int64_t V,
                    int64_t K, int64_t panel, int64_t max_candidates, std::vector<int64_t>& candidates) {
  // The candidates, hi >= lo, in ascending order.
  candidates.clear();
  int64_t u = 0;
#if defined(__AVX512F__) && !defined(BATCHGEN_EMULATE_AVX512) && !defined(BATCHGEN_TILE16_HALVES)
  const __m512 vlo = _mm512_set1_ps(lo);
  for (; u + 16 <= V; u += 16) {
    for (uint32_t m = _mm512_cmp_ps_mask(_mm512_loadu_ps(hi + u), vlo, _CMP_GE_OQ); m != 0; m &= m - 1) {
      if (static_cast<int64_t>(candidates.size()) == max_candidates) return -1;
      candidates.push_back(u + __builtin_ctz(m));
    }
  }
#endif
  for (; u < V; ++u) {
    if (hi[u] < lo) continue;
    if (static_cast<int64_t>(candidates.size()) == max_candidates) return -1;
    candidates.push_back(u);
  }
  // Up to kGroup candidates' chains side by side: independent FMAs, and their weights' lines
  // (one per k, panel floats apart) asked for together.
  constexpr int64_t kGroup = 8;
  int64_t best = -1;
  float best_logit = 0.f;
  for (size_t g = 0; g < candidates.size(); g += kGroup) {
    const int64_t n = std::min<int64_t>(kGroup, static_cast<int64_t>(candidates.size() - g));
    float f[kGroup];
    if (rows != nullptr) {
      exact_logits_rows(x, rows, K, candidates.data() + g, n, f);
    } else {
      exact_logits(x, packed, K, panel, candidates.data() + g, n, f);
    }
    for (int64_t j = 0; j < n; ++j) {  // ascending: among equal logits the lowest index stays
      if (std::isnan(f[j])) return -1;
      if (best < 0 || f[j] > best_logit) best = candidates[g + j], best_logit = f[j];
    }
  }
  return best;
}

// x contiguous [M, K] float32, the head's packed panels [P, K, panel] float32.
inline void check_x_and_head(const torch::Tensor& x, const torch::Tensor& packed) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kFloat && packed.is_contiguous() &&
                  packed.size(1) == x.size(1),
              "packed: contiguous [P, K, panel] float32 with x's K");
}

// The row-major weight's data where given ([V, K] float32, contiguous), else null.
inline const float* checked_rows(const c10::optional<torch::Tensor>& rows, int64_t V, int64_t K) {
  if (!rows.has_value()) return nullptr;
  TORCH_CHECK(rows->dim() == 2 && rows->size(0) >= V && rows->size(1) == K && rows->scalar_type() == torch::kFloat &&
                  rows->is_contiguous(),
              "rows: the head's weight, contiguous [V, K] float32");
  return rows->data_ptr<float>();
}

}  // namespace greedy

// estimates float32 [M, V] (x's logits with bfloat16 operands), x float32 [M, K], packed the LM
// head's float32 panels [P, K, panel] (cpu_linear.h's layout), norms float32 [V] (each column's
// Euclidean norm, rounded up): int64 [M], each row's greedy token or -1 (see the top of the file).
inline torch::Tensor greedy_screen(const torch::Tensor& estimates, const torch::Tensor& x, const torch::Tensor& packed,
                                   const torch::Tensor& norms, double coef, int64_t max_candidates,
                                   const c10::optional<torch::Tensor>& rows) {
  greedy::check_x_and_head(x, packed);
  const int64_t M = x.size(0), K = x.size(1), panel = packed.size(2);
  TORCH_CHECK(estimates.dim() == 2 && estimates.scalar_type() == torch::kFloat && estimates.is_contiguous() &&
                  estimates.size(0) == M,
              "estimates: contiguous [M, V] float32");
  const int64_t V = estimates.size(1);
  TORCH_CHECK(V > 0 && V <= packed.size(0) * panel, "estimates: ", V, " columns, more than the packed weight's");
  TORCH_CHECK(norms.dim() == 1 && norms.size(0) == V && norms.scalar_type() == torch::kFloat && norms.is_contiguous(),
              "norms: contiguous [V] float32");
  TORCH_CHECK(coef > 0 && max_candidates > 0, "coef and max_candidates must be positive");
  const float* rows_p = greedy::checked_rows(rows, V, K);
  auto out = torch::empty({M}, x.options().dtype(torch::kInt64));
  const float* est = estimates.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  const float* n = norms.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  double max_norm = 0.0;  // NaN stays (std::max keeps the first argument)
  for (int64_t v = 0; v < V; ++v) max_norm = std::isnan(n[v]) ? n[v] : std::max<double>(max_norm, n[v]);
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> hi(V);
    std::vector<int64_t> candidates;
    candidates.reserve(max_candidates);
    for (int64_t r = begin; r < end; ++r) {
      o[r] = greedy::row_token(est + r * V, xp + r * K, w, rows_p, n, max_norm, V, K, panel, coef, max_candidates, hi.data(), candidates);
    }
  });
  return out;
}
