// The greedy screen's estimate in int8 (AVX512-VNNI): the LM head's logits from 8-bit x and 8-bit
// weights, each within a proven distance of its float32 logit, for greedy::pick (cpu_greedy.h).
//
// Both operands are quantized in groups of kGroup (64) consecutive k, each with its own scale: a
// weight row v's group g as s_vg * w8 (w8 in [-127, 127], s_vg = max |w_vg| / 127, at load), a row
// x's group g as s_xg * q (the same, per call). A group's products are summed exactly in int32
// (VNNI: u8 x s8 into int32; the weight is stored as w8 + 128, and 128 * sum(q_g) taken off), and
// the groups' sums D_g are added in float32: estimate_v = sum_g (s_xg s_vg) D_g.
//
// The bound. With d_g = x_g - s_xg q_g and e_v = w_v - s_v w8_v (the quantization errors, kept
// exactly: d in double per call, e in float64 at load), x . w_v - sum_g s_xg s_vg q_g . w8_vg =
// d . (s_v w8_v) + x . e_v, so by Cauchy-Schwarz, group by group,
//     |x . w_v - sum_g t_g| <= sum_g |d_g| B_vg + |x| E_v,   B_vg = |s_vg w8_vg|, E_v = |e_v|,
// and the float32 sum of the t_g (one rounding for s_xg s_vg, one per FMA; D_g < 2^24 is exact)
// errs by at most c sum_g |t_g| <= c sum_g (|x_g| + |d_g|) B_vg with c = (ng + 2) 2^-24 * 1.01.
// The float32 logit f_v (one FMA chain over K) is within gamma_K |x| |w_v| of x . w_v. So
//     |estimate_v - f_v| <= sum_g a_g B_vg + |x| Q_v,   a_g = |d_g| (1 + c) + c |x_g|,
//     Q_v = E_v + gamma_K |w_v| (at load),
// all rounded up. Scales below 2^-40 are not used (that group is 0 and its error is all of it), so
// s_xg s_vg stays a normal float; a row with a value above 1e30 or not finite is left undecided.
//
// Measured on the 2-core AVX-512 EPYC (SmolLM2's head, 49,152 x 576): 8.3 ms for 256 rows where
// the bfloat16 estimate takes 13.4-14.6; candidates a row on ShareGPT decode rows: 11.2 on
// average (median 5, at most 332), against 3.1 with bfloat16.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace greedy8 {

constexpr int64_t kGroup = 64;  // k per quantization group
constexpr int kRows = 4;        // rows of a tile
constexpr int kPanels = 3;      // 16 columns each: a tile is kRows x 48
constexpr float kTinyScale = 0x1p-40f;

// Rows R of x (quantized: q, its scales and corrections) against one tile's 3 panels of the packed
// weight ([panel][Kp / 4][16][4] bytes, panel stride Kp * 16; scales [panel][ng][16]), into out.
template <int R>
__attribute__((noinline)) void tile(const int8_t* __restrict q, int64_t Kp, const float* __restrict xs,
                                    const int32_t* __restrict xc, int64_t ng, const uint8_t* __restrict w,
                                    const float* __restrict ws, float* __restrict out, int64_t ldo) {
  __m512 accf[R][kPanels];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanels; ++j) accf[r][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m512i acc[R][kPanels];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kPanels; ++j) acc[r][j] = _mm512_setzero_si512();
    const uint8_t* wg = w + g * kGroup * 16;
    const int8_t* qg = q + g * kGroup;
#pragma GCC unroll 16
    for (int k4 = 0; k4 < kGroup / 4; ++k4) {
      __m512i a[kPanels];
      for (int j = 0; j < kPanels; ++j) a[j] = _mm512_loadu_si512(wg + j * Kp * 16 + k4 * 64);
      for (int r = 0; r < R; ++r) {
        int32_t four;
        std::memcpy(&four, qg + r * Kp + k4 * 4, 4);
        const __m512i b = _mm512_set1_epi32(four);
        for (int j = 0; j < kPanels; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], a[j], b);
      }
    }
    for (int j = 0; j < kPanels; ++j) {
      const __m512 sv = _mm512_loadu_ps(ws + j * ng * 16 + g * 16);
      for (int r = 0; r < R; ++r) {
        const __m512 scale = _mm512_mul_ps(sv, _mm512_set1_ps(xs[r * ng + g]));
        const __m512i sum = _mm512_sub_epi32(acc[r][j], _mm512_set1_epi32(xc[r * ng + g]));
        accf[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, accf[r][j]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanels; ++j) _mm512_storeu_ps(out + r * ldo + 16 * j, accf[r][j]);
}

// One row of x quantized (see the top of the file): q [Kp] (0 past K), scale and correction per
// group, a_g per group (rounded up), and |x| rounded up; false where the row is not finite or a
// value passes 1e30.
inline bool quantize_row(const float* x, int64_t K, int64_t Kp, int8_t* q, float* scale, int32_t* corr, float* a,
                         float* norm) {
  const int64_t ng = Kp / kGroup;
  const double c = (static_cast<double>(ng) + 2.0) * 0x1p-24 * 1.01;
  double total = 0.0;
  bool ok = true;
  for (int64_t g = 0; g < ng; ++g) {
    const int64_t k0 = g * kGroup, k1 = std::min(K, k0 + kGroup);
    float m = 0.f;
    for (int64_t k = k0; k < k1; ++k) m = std::max(m, std::fabs(x[k]));  // a NaN is caught below
    double xsq = 0.0;
    for (int64_t k = k0; k < k1; ++k) xsq += static_cast<double>(x[k]) * x[k];
    if (!std::isfinite(xsq) || !(m <= 1e30f)) ok = false;
    const float s = ok && m >= kTinyScale ? m / 127.f : 0.f;
    double dsq = 0.0;
    int32_t sum = 0;
    for (int64_t k = k0; k < k0 + kGroup; ++k) {
      int32_t v = 0;
      if (k < k1 && s > 0.f) v = static_cast<int32_t>(std::max(-127.f, std::min(127.f, std::nearbyint(x[k] / s))));
      q[k] = static_cast<int8_t>(v);
      sum += v;
      if (k < k1) {
        const double d = static_cast<double>(x[k]) - static_cast<double>(s) * v;
        dsq += d * d;
      }
    }
    scale[g] = s;
    corr[g] = 128 * sum;
    const double dn = std::sqrt(dsq) * (1.0 + 1e-9), xn = std::sqrt(xsq) * (1.0 + 1e-9);
    a[g] = static_cast<float>((dn * (1.0 + c) + c * xn) * (1.0 + 0x1p-20));
    total += xsq;
  }
  *norm = ok ? static_cast<float>(std::sqrt(total) * (1.0 + 1e-9) * (1.0 + 0x1p-20)) : -1.f;
  return ok;
}

// One row's token from its int8 estimates (est, V of them), a_g (ng), |x| and the head's B
// ([V16 / 16][ng][16]), |B_v| and Q ([V]): the bound of the top of the file on each estimate, then
// greedy::pick; -1 where the row was left undecided or an estimate is not finite.
//
// The bound's sum over groups reads ng floats of B per column, more than the estimates
// themselves, so it is taken only where it can matter: a first pass bounds every column by
// |a| |B_v| + |x| Q_v (Cauchy-Schwarz over the groups, so never below the sum; 2^-12 more for
// the two sums' float32 roundings), which gives lo' <= lo and the columns with est + bound >= lo';
// the per-group bound of those gives lo, and every other column has est + its bound < lo' <= lo.
inline int64_t row_token(const float* est, const float* a, float xn, const float* bsum, const float* bnorm,
                         const float* qv, const float* x, const float* packed, const float* rows, int64_t V, int64_t ng,
                         int64_t K,
                         int64_t panel, int64_t max_candidates, float* hi, std::vector<int64_t>& candidates) {
  if (!(xn >= 0.f)) return -1;
  const float kTiny = 0x1p-100f;  // what underflows in the bound's own products
  double asq = 0.0;
  for (int64_t g = 0; g < ng; ++g) asq += static_cast<double>(a[g]) * a[g];
  const float an = static_cast<float>(std::sqrt(asq) * (1.0 + 0x1p-20));
  if (!std::isfinite(an)) return -1;
  float lo = -std::numeric_limits<float>::infinity();
  float bad = 0.f;  // NaN where an estimate is not finite
  int64_t v = 0;
  {
    __m512 vlo = _mm512_set1_ps(lo), vbad = _mm512_setzero_ps();
    const __m512 vx = _mm512_set1_ps(xn), va = _mm512_set1_ps(an), eps = _mm512_set1_ps(0x1p-20f),
                 tiny = _mm512_set1_ps(kTiny), grow = _mm512_set1_ps((1.f + 0x1p-10f) * (1.f + 0x1p-12f));
    for (; v + 16 <= V; v += 16) {
      __m512 b = _mm512_fmadd_ps(va, _mm512_loadu_ps(bnorm + v), _mm512_mul_ps(vx, _mm512_loadu_ps(qv + v)));
      const __m512 e = _mm512_loadu_ps(est + v);
      vbad = _mm512_add_ps(vbad, _mm512_mul_ps(e, _mm512_setzero_ps()));
      b = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(b, grow), _mm512_mul_ps(_mm512_abs_ps(e), eps)), tiny);
      vlo = _mm512_max_ps(vlo, _mm512_sub_ps(e, b));
      _mm512_storeu_ps(hi + v, _mm512_add_ps(e, b));
    }
    lo = _mm512_reduce_max_ps(vlo);
    bad = _mm512_reduce_add_ps(vbad);
  }
  for (; v < V; ++v) {
    const float e = est[v];
    bad += e * 0.f;
    const float b = std::fma(an, bnorm[v], xn * qv[v]) * ((1.f + 0x1p-10f) * (1.f + 0x1p-12f)) +
                    std::fabs(e) * 0x1p-20f + kTiny;
    lo = std::max(lo, e - b);
    hi[v] = e + b;
  }
  if (!(bad == 0.f)) return -1;
  // The columns the first bound keeps, with their per-group bound.
  candidates.clear();
  int64_t u0 = 0;
  const __m512 vlo = _mm512_set1_ps(lo);
  for (; u0 + 16 <= V; u0 += 16) {
    for (uint32_t m = _mm512_cmp_ps_mask(_mm512_loadu_ps(hi + u0), vlo, _CMP_GE_OQ); m != 0; m &= m - 1) {
      candidates.push_back(u0 + __builtin_ctz(m));
    }
  }
  for (; u0 < V; ++u0) {
    if (hi[u0] >= lo) candidates.push_back(u0);
  }
  float tight_lo = -std::numeric_limits<float>::infinity();
  for (const int64_t u : candidates) {
    const float* bv = bsum + (u / 16) * ng * 16 + u % 16;
    float b = xn * qv[u];
    for (int64_t g = 0; g < ng; ++g) b = std::fma(a[g], bv[g * 16], b);
    const float e = est[u];
    b = b * (1.f + 0x1p-10f) + std::fabs(e) * 0x1p-20f + kTiny;
    tight_lo = std::max(tight_lo, e - b);
    hi[u] = e + b;
  }
  return greedy::pick(hi, tight_lo, x, packed, rows, V, K, panel, max_candidates, candidates);
}

}  // namespace greedy8

// x [M, K] float32 against the int8 head (w8 uint8 [V16 / 16, Kp / 4, 16, 4], the weight + 128;
// scales float32 [V16 / 16, ng, 16]; V16 a multiple of 48): {estimates float32 [M, V16], a float32
// [M, ng], |x| float32 [M] (-1: a row left undecided)}.
inline std::vector<torch::Tensor> greedy_estimate_int8(const torch::Tensor& x, const torch::Tensor& w8,
                                                       const torch::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(w8.dim() == 4 && w8.scalar_type() == torch::kUInt8 && w8.is_contiguous() && w8.size(2) == 16 &&
                  w8.size(3) == 4,
              "w8: contiguous [V16 / 16, Kp / 4, 16, 4] uint8");
  const int64_t M = x.size(0), K = x.size(1), panels = w8.size(0), Kp = w8.size(1) * 4;
  TORCH_CHECK(Kp % greedy8::kGroup == 0 && Kp >= K && Kp < K + greedy8::kGroup, "w8: K padded to whole groups of ",
              greedy8::kGroup, ", got ", Kp, " for K = ", K);
  TORCH_CHECK(panels % greedy8::kPanels == 0, "w8: a multiple of ", greedy8::kPanels, " panels");
  const int64_t ng = Kp / greedy8::kGroup, V16 = panels * 16;
  TORCH_CHECK(scales.dim() == 3 && scales.scalar_type() == torch::kFloat && scales.is_contiguous() &&
                  scales.size(0) == panels && scales.size(1) == ng && scales.size(2) == 16,
              "scales: contiguous [V16 / 16, ng, 16] float32");
  auto q = torch::empty({M, Kp}, x.options().dtype(torch::kInt8));
  auto xs = torch::empty({M, ng}, x.options());
  auto xc = torch::empty({M, ng}, x.options().dtype(torch::kInt32));
  auto a = torch::empty({M, ng}, x.options());
  auto xn = torch::empty({M}, x.options());
  auto est = torch::empty({M, V16}, x.options());
  const float* xp = x.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* xsp = xs.data_ptr<float>();
  int32_t* xcp = xc.data_ptr<int32_t>();
  float* ap = a.data_ptr<float>();
  float* xnp = xn.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      greedy8::quantize_row(xp + r * K, K, Kp, qp + r * Kp, xsp + r * ng, xcp + r * ng, ap + r * ng, xnp + r);
    }
  });
  const uint8_t* wp = w8.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  float* ep = est.data_ptr<float>();
  at::parallel_for(0, panels / greedy8::kPanels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* w = wp + t * greedy8::kPanels * Kp * 16;
      const float* s = sp + t * greedy8::kPanels * ng * 16;
      for (int64_t r0 = 0; r0 < M; r0 += greedy8::kRows) {
        const int64_t n = std::min<int64_t>(greedy8::kRows, M - r0);
        tile16::with_rows<greedy8::kRows>(n, [&](auto rows) {
          greedy8::tile<decltype(rows)::value>(qp + r0 * Kp, Kp, xsp + r0 * ng, xcp + r0 * ng, ng, w, s,
                                               ep + r0 * V16 + t * greedy8::kPanels * 16, V16);
        });
      }
    }
  });
  return {est, a, xn};
}

// Each row's greedy token from greedy_estimate_int8's output, the float32 head (packed [P, K,
// panel]), the head's B (float32 [V16 / 16, ng, 16]), |B_v| and Q (float32 [V]); -1 where undecided.
inline torch::Tensor greedy_screen_int8(const torch::Tensor& estimates, const torch::Tensor& a, const torch::Tensor& xn,
                                        const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& bsum,
                                        const torch::Tensor& bnorm, const torch::Tensor& qv, int64_t max_candidates,
                                        const c10::optional<torch::Tensor>& rows) {
  greedy::check_x_and_head(x, packed);
  const int64_t M = x.size(0), K = x.size(1), panel = packed.size(2);
  TORCH_CHECK(qv.dim() == 1 && qv.scalar_type() == torch::kFloat && qv.is_contiguous(), "q: contiguous [V] float32");
  const int64_t V = qv.size(0);
  TORCH_CHECK(bnorm.dim() == 1 && bnorm.size(0) == V && bnorm.scalar_type() == torch::kFloat && bnorm.is_contiguous(),
              "bnorm: contiguous [V] float32");
  TORCH_CHECK(V > 0 && V <= packed.size(0) * panel, "q: ", V, " columns, more than the packed weight's");
  TORCH_CHECK(bsum.dim() == 3 && bsum.scalar_type() == torch::kFloat && bsum.is_contiguous() && bsum.size(2) == 16 &&
                  bsum.size(0) * 16 >= V,
              "b: contiguous [V16 / 16, ng, 16] float32");
  const int64_t ng = bsum.size(1);
  TORCH_CHECK(estimates.dim() == 2 && estimates.scalar_type() == torch::kFloat && estimates.is_contiguous() &&
                  estimates.size(0) == M && estimates.size(1) >= V,
              "estimates: contiguous [M, >= V] float32");
  TORCH_CHECK(a.dim() == 2 && a.size(0) == M && a.size(1) == ng && a.scalar_type() == torch::kFloat && a.is_contiguous(),
              "a: contiguous [M, ng] float32");
  TORCH_CHECK(xn.dim() == 1 && xn.size(0) == M && xn.scalar_type() == torch::kFloat, "xn: [M] float32");
  TORCH_CHECK(max_candidates > 0, "max_candidates must be positive");
  const float* rows_p = greedy::checked_rows(rows, V, K);
  auto out = torch::empty({M}, x.options().dtype(torch::kInt64));
  const int64_t lde = estimates.size(1);
  const float* est = estimates.data_ptr<float>();
  const float* ap = a.data_ptr<float>();
  auto xn_c = xn.contiguous();
  const float* xnp = xn_c.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  const float* bp = bsum.data_ptr<float>();
  const float* qp = qv.data_ptr<float>();
  const float* bnp = bnorm.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, M, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> hi(V);
    std::vector<int64_t> candidates;
    candidates.reserve(max_candidates);
    for (int64_t r = begin; r < end; ++r) {
      o[r] = greedy8::row_token(est + r * lde, ap + r * ng, xnp[r], bp, bnp, qp, xp + r * K, w, rows_p, V, ng, K, panel,
                                max_candidates, hi.data(), candidates);
    }
  });
  return out;
}
