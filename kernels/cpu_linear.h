// Linear layers (y = x W^T + b, float32) over a weight packed once into column panels, for the
// decode step's GEMMs: tens to hundreds of rows against weights far larger than the caches.
//
// Packed layout (kernels/linear_cpu.py packs it): W [N, K] becomes panels [P, K, kPanel], where
// panel p holds output columns p*kPanel .. p*kPanel + kPanel - 1, zero-padded past N, so that the
// kPanel weights of one k are one contiguous run. A micro-kernel keeps kLinearRows rows x kPanel
// columns of the output in vector registers and walks k: load the panel's k-th run (kPanel / 16
// vectors), broadcast each row's x[r, k], one FMA per accumulator. A panel (K x kPanel floats:
// 108 KB at K = 576, 288 KB at K = 1536) stays in L2 while every block of rows passes over it;
// x's rows stay in L1/L2.
//
// Why not oneDNN's or MKL's packed sgemm: at decode sizes the weights come from memory (a
// SmolLM2 step reads 537 MB of them), and those libraries' kernels wait on it. Here each block of
// rows also asks for its share of the thread's next panel (software prefetch, spread over the
// k loop), so the next panel is in cache when its turn comes. Measured on a 2-core AVX-512 EPYC,
// 30 layers' projections plus the LM head with cold weights: 64 rows 38.0 ms against oneDNN's
// 51.2 (jobs/bench/linear_kernel.py).
//
// Every output element is one chain of FMAs in k order, from zero, plus the bias: no split of k,
// no reordering by row count. So a row's result does not depend on the other rows in the call
// (batch invariance), and the AVX-512 build, the AVX2 halves and the scalar emulation give the
// same bits (lane for lane the same operations).
//
// The gated MLP's first projection is fused with its activation (packed_silu_gate_up):
// silu(x G^T) * (x U^T) for the gate rows G and up rows U of one [2n, K] matrix, packed as panels
// of kGatedHalf gate columns followed by the same kGatedHalf up columns, so that a panel's
// accumulators hold both halves of its outputs and the [M, 2n] product is never written. Its
// products are the same FMA chains, and silu(g) * u the same arithmetic lane for lane as
// silu_and_mul in cpu_small_ops.h: the fused result equals the two ops' bit for bit.
//
// Threads: torch's intra-op pool, over panels; passes of kRowBlock rows one after the other, so
// a prefill chunk's x block stays in L2 while the weights stream past it, and k in slices of
// kKBlock where K is longer (Llama-3.2-1B's down projection, K = 8,192).
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace tile16 {

#if defined(BATCHGEN_TILE16_HALVES)
// 16 AVX2 registers: 6 rows x 16 columns is 12 accumulators, 2 weight halves, 1 broadcast; the
// gated kernel 3 rows x (16 gate + 16 up columns), 12 accumulators.
constexpr int kLinearVectors = 1;
constexpr int kLinearRows = 6;
constexpr int kGatedVectors = 1;
constexpr int kGatedRows = 3;
#else
// 32 AVX-512 registers: 8 rows x 48 columns is 24 accumulators, 3 weight vectors, 1 broadcast; the
// gated kernel 6 rows x (32 gate + 32 up columns), 24 accumulators.
constexpr int kLinearVectors = 3;
constexpr int kLinearRows = 8;
constexpr int kGatedVectors = 2;
constexpr int kGatedRows = 6;
#endif
constexpr int64_t kPanel = 16 * kLinearVectors;
constexpr int64_t kGatedHalf = 16 * kGatedVectors;
// Rows per pass over the weights: x's block at K = 1536 is 1.5 MB; the measured prefill rate at
// 2048 rows did not improve below 256.
constexpr int64_t kRowBlock = 256;
// k per slice of a panel: 2,048 k of 48 columns is 384 KB, of the gated kernel's 64 columns 512 KB,
// within a 1 MB L2; Llama-3.2-1B's down projection (K = 8,192: 1.5 MB panels) ran at 0.91x oneDNN's
// rate at 256 rows in whole-K passes.
constexpr int64_t kKBlock = 2048;

// One k step of accumulate below: float32 x and w, one FMA per accumulator.
template <int R, int V>
inline void accumulate_step(const float* __restrict x, int64_t lda, const float* __restrict w, int64_t k,
                            __m512 (&acc)[R][V]) {
  __m512 b[V];
  for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(w + k * 16 * V + 16 * v);
  for (int r = 0; r < R; ++r) {
    const __m512 a = _mm512_set1_ps(x[r * lda + k]);
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
  }
}

#if defined(BATCHGEN_BF16_DOT)
// One k step of the bfloat16 kernel: x and w hold bfloat16 pairs (k = 2i, 2i + 1 in one 32-bit
// unit; K counts pairs), and each accumulator takes one AVX512-BF16 dot product,
// acc + x[2i] w[2i] + x[2i + 1] w[2i + 1] in float32: twice the multiply-adds of an FMA, from half
// the bytes of weight.
template <int R, int V>
inline void accumulate_step(const uint32_t* __restrict x, int64_t lda, const uint32_t* __restrict w, int64_t k,
                            __m512 (&acc)[R][V]) {
  __m512bh b[V];
  for (int v = 0; v < V; ++v) b[v] = (__m512bh)_mm512_loadu_si512(w + k * 16 * V + 16 * v);
  for (int r = 0; r < R; ++r) {
    const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * lda + k]));
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
  }
}
#endif

// acc[r][v] = from[r][v] (or 0 where from is null) + the sum over k < K of x[r, k] * w[k, 16 v ..
// 16 v + 15] for R rows of x (row stride lda) and a panel slice w of V vectors' width, asking for
// `prefetch_lines` cache lines from `prefetch` on the way (spread over the k steps). T: float,
// or a bfloat16 pair (accumulate_step). Every output is one chain in k order, whatever R.
template <int R, int V, class T>
inline void accumulate(const T* __restrict x, int64_t lda, const T* __restrict w, int64_t K, const char* prefetch,
                       int64_t prefetch_lines, __m512 (&acc)[R][V], const float* from) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = from ? _mm512_loadu_ps(from + (r * V + v) * 16) : _mm512_setzero_ps();
  // k in groups of kGroup steps: a group's share of the prefetches first, then its steps unrolled
  // with no branch between them. (A prefetch check inside every k step cost the 8 x 48 kernel 6-12%
  // on an Intel Xeon, Emerald Rapids: its loop kept scalars on the stack around the FMAs.)
  constexpr int64_t kGroup = 8;
  const int64_t groups = K / kGroup;
  const int64_t lines_per_group = groups ? (prefetch_lines + groups - 1) / groups : 0;
  int64_t k = 0, line = 0;
  for (int64_t g = 0; g < groups; ++g, k += kGroup) {
    for (int64_t j = 0; j < lines_per_group && line < prefetch_lines; ++j, ++line) {
      __builtin_prefetch(prefetch + line * 64, 0, 3);
    }
#pragma GCC unroll 8
    for (int64_t i = 0; i < kGroup; ++i) accumulate_step<R, V>(x, lda, w, k + i, acc);
  }
  for (; k < K; ++k) accumulate_step<R, V>(x, lda, w, k, acc);
  for (; line < prefetch_lines; ++line) __builtin_prefetch(prefetch + line * 64, 0, 3);  // K below one group
}

#if defined(BATCHGEN_BF16_DOT)
// x [M, K] float32 as bfloat16 [M, K2 pairs] (round to nearest even; a zero after the last k where
// K is odd), the bfloat16 kernel's input.
inline void to_bf16_pairs(const float* x, int64_t M, int64_t K, int64_t K2, uint16_t* out) {
  at::parallel_for(0, M, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x + r * K;
      uint16_t* dst = out + r * 2 * K2;
      for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 mask = static_cast<__mmask16>(K - k >= 16 ? 0xFFFF : (1u << (K - k)) - 1u);
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, row + k));
        _mm256_mask_storeu_epi16(dst + k, mask, (__m256i)h);
      }
      if (K % 2) dst[K] = 0;
    }
  });
}
#endif

// The sums of R rows kept between two slices of k (exact: float32 stored and read back).
template <int R, int V>
inline void keep(const __m512 (&acc)[R][V], float* part) {
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(part + (r * V + v) * 16, acc[r][v]);
}

// The `n` (1 .. 16) first lanes of y to out; a whole vector where n is 16.
inline void store_lanes(float* out, __m512 y, int64_t n) {
  if (n == 16) {
    _mm512_storeu_ps(out, y);
    return;
  }
  float tail[16];
  _mm512_storeu_ps(tail, y);
  std::memcpy(out, tail, sizeof(float) * n);
}

// Rows [0, R) times one slice of k (kn of them) of a linear panel: on the last slice into out
// (row stride ldc, `cols` valid columns) plus the bias's `cols` values where there is one, on the
// others into `part`; the sums start from `part` except on the first slice. Out of line on
// purpose: inlined into over_panels, GCC kept the accumulators in memory through the k loop
// (170 GFLOP/s against 470 at 64 rows).
template <int R, class T>
__attribute__((noinline)) void linear_rows(const T* x, int64_t lda, int64_t kn, const T* w, const float* bias,
                                           float* out, int64_t ldc, int64_t cols, const char* prefetch,
                                           int64_t prefetch_lines, float* part, bool first, bool last) {
  __m512 acc[R][kLinearVectors];
  accumulate<R, kLinearVectors>(x, lda, w, kn, prefetch, prefetch_lines, acc, first ? nullptr : part);
  if (!last) {
    keep<R, kLinearVectors>(acc, part);
    return;
  }
  for (int v = 0; v < kLinearVectors && 16 * v < cols; ++v) {
    const int64_t c0 = 16 * v, n = std::min<int64_t>(16, cols - c0);
    float add[16] = {};
    if (bias) std::memcpy(add, bias + c0, sizeof(float) * n);  // never past the bias's end
    const __m512 b = _mm512_loadu_ps(add);
    for (int r = 0; r < R; ++r) store_lanes(out + r * ldc + c0, bias ? _mm512_add_ps(acc[r][v], b) : acc[r][v], n);
  }
}

// silu(g) * u, 16 lanes: g * sigmoid(g) with sigmoid from e = exp(-|g|) (1 / (1 + e), or e / (1 + e)
// for g < 0), as silu_and_mul computes it.
inline __m512 silu_mul(__m512 g, __m512 u) {
  const __m512 zero = _mm512_setzero_ps();
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp_neg(_mm512_sub_ps(zero, _mm512_abs_ps(g)));
  const __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
  const __mmask16 negative = _mm512_cmp_ps_mask(g, zero, _CMP_LT_OQ);
  const __m512 sig = _mm512_mask_blend_ps(negative, inv, _mm512_mul_ps(e, inv));
  return _mm512_mul_ps(_mm512_mul_ps(g, sig), u);
}

// Rows [0, R) times one slice of a gated panel: on the last slice silu of the gate half times the
// up half, `cols` valid columns; as linear_rows otherwise.
template <int R, class T>
__attribute__((noinline)) void gated_rows(const T* x, int64_t lda, int64_t kn, const T* w,
                                          const float* /*bias*/, float* out, int64_t ldc, int64_t cols,
                                          const char* prefetch, int64_t prefetch_lines, float* part, bool first,
                                          bool last) {
  __m512 acc[R][2 * kGatedVectors];
  accumulate<R, 2 * kGatedVectors>(x, lda, w, kn, prefetch, prefetch_lines, acc, first ? nullptr : part);
  if (!last) {
    keep<R, 2 * kGatedVectors>(acc, part);
    return;
  }
  for (int v = 0; v < kGatedVectors && 16 * v < cols; ++v) {
    const int64_t c0 = 16 * v, n = std::min<int64_t>(16, cols - c0);
    for (int r = 0; r < R; ++r) store_lanes(out + r * ldc + c0, silu_mul(acc[r][v], acc[r][kGatedVectors + v]), n);
  }
}

// f(std::integral_constant<int, n>) for a runtime 1 <= n <= R.
template <int R, typename F>
inline void with_rows(int64_t n, F&& f) {
  if constexpr (R > 0) {
    if (n == R) {
      f(std::integral_constant<int, R>{});
    } else {
      with_rows<R - 1>(n, f);
    }
  }
}

// out [M, out_cols] from x [M, K] and a packed weight [P, K, 16 * kVectors] whose panel p makes
// output columns p * kOutCols .. (at most kOutCols of them): passes of kRowBlock rows, each over
// all panels on torch's threads. On a panel, k runs in slices of kKBlock (so that a slice of a
// long-K panel stays in L2 while every block of rows passes over it), each slice in blocks of
// kRows rows through Rows<n>; a block's sums wait in `partial` between slices (exact float32, so
// every output is still one FMA chain in k order). Step j of a panel's slices x blocks asks for
// the j-th share of the thread's next panel.
// T: float (K counts floats), or where the CPU has AVX512-BF16 uint32_t, a pair of bfloat16 (K
// counts pairs).
template <int kVectors, int kRows, int64_t kOutCols, template <int> class Rows, class T = float>
inline void over_panels(const T* x, int64_t M, int64_t K, const T* w, int64_t P, const float* bias, float* out,
                        int64_t out_cols) {
  static_assert(sizeof(T) == sizeof(float), "a k step is 4 bytes: one float or two bfloat16");
  const int64_t panel_floats = K * 16 * kVectors;  // 4-byte units: floats, or bfloat16 pairs
  const int64_t lines = panel_floats * static_cast<int64_t>(sizeof(T)) / 64;
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, M - m0);
    const int64_t blocks = (m + kRows - 1) / kRows;
    const int64_t slices = (K + kKBlock - 1) / kKBlock, steps = slices * blocks;
    at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> partial(slices > 1 ? m * 16 * kVectors : 0);  // the rows' sums between slices
      for (int64_t p = begin; p < end; ++p) {
        const int64_t c0 = p * kOutCols;
        const int64_t cols = std::min<int64_t>(kOutCols, out_cols - c0);
        const char* next = p + 1 < end ? reinterpret_cast<const char*>(w + (p + 1) * panel_floats) : nullptr;
        for (int64_t s = 0, step = 0; s < slices; ++s) {
          const int64_t k0 = s * kKBlock, kn = std::min(kKBlock, K - k0);
          for (int64_t i = 0; i < blocks; ++i, ++step) {
            const int64_t r0 = m0 + i * kRows;
            const char* pf = next ? next + (lines * step / steps) * 64 : nullptr;
            const int64_t pf_lines = next ? lines * (step + 1) / steps - lines * step / steps : 0;
            float* part = partial.data() + i * kRows * 16 * kVectors;
            // this pass's rows only (not past m: `partial` holds m rows)
            with_rows<kRows>(std::min<int64_t>(kRows, m - i * kRows), [&](auto rows) {
              Rows<decltype(rows)::value>::run(x + r0 * K + k0, K, kn, w + p * panel_floats + k0 * 16 * kVectors,
                                               bias ? bias + c0 : nullptr, out + r0 * out_cols + c0, out_cols, cols,
                                               pf, pf_lines, part, s == 0, s + 1 == slices);
            });
          }
        }
      }
    });
  }
}

template <int R>
struct LinearRows {
  template <class T>
  static void run(const T* x, int64_t lda, int64_t kn, const T* w, const float* bias, float* out, int64_t ldc,
                  int64_t cols, const char* pf, int64_t pf_lines, float* part, bool first, bool last) {
    linear_rows<R, T>(x, lda, kn, w, bias, out, ldc, cols, pf, pf_lines, part, first, last);
  }
};

template <int R>
struct GatedRows {
  template <class T>
  static void run(const T* x, int64_t lda, int64_t kn, const T* w, const float* bias, float* out, int64_t ldc,
                  int64_t cols, const char* pf, int64_t pf_lines, float* part, bool first, bool last) {
    gated_rows<R, T>(x, lda, kn, w, bias, out, ldc, cols, pf, pf_lines, part, first, last);
  }
};

// The checks the entry points make: x a contiguous float32 [M, K], packed a contiguous [P, k_steps,
// width] of `packed_type` (float32; int32 for bfloat16 pairs, k_steps = ceil(K / 2)) whose P
// panels of `per_panel` output columns hold `columns` of them.
inline void check_packed(const torch::Tensor& x, const torch::Tensor& packed, int64_t width, int64_t per_panel,
                         int64_t columns, torch::ScalarType packed_type = torch::kFloat) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == packed_type && packed.is_contiguous() &&
                  packed.size(2) == width,
              "packed: contiguous [P, K, ", width, "] ", packed_type == torch::kFloat ? "float32" : "int32 (bfloat16 pairs)");
  const int64_t k_steps = packed_type == torch::kFloat ? x.size(1) : (x.size(1) + 1) / 2;
  TORCH_CHECK(packed.size(1) == k_steps, "x has ", x.size(1), " columns, the packed weight ", packed.size(1),
              packed_type == torch::kFloat ? "" : " pairs");
  const int64_t P = packed.size(0);
  TORCH_CHECK(columns > (P - 1) * per_panel && columns <= P * per_panel, "out_features ", columns, " does not fit ", P,
              " panels");
}

// The bias's data (a contiguous float32 [out_features]), or null where there is none.
inline const float* checked_bias(const c10::optional<torch::Tensor>& bias, int64_t out_features) {
  if (!bias.has_value()) return nullptr;
  TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out_features && bias->scalar_type() == torch::kFloat &&
                  bias->is_contiguous(),
              "bias: contiguous [out_features] float32");
  return bias->data_ptr<float>();
}

}  // namespace tile16

// x [M, K] (float32, contiguous) times a weight packed as [P, K, kPanel] with `out_features`
// real columns, plus an optional bias [out_features]: [M, out_features].
inline torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features,
                                   const c10::optional<torch::Tensor>& bias) {
  tile16::check_packed(x, packed, tile16::kPanel, tile16::kPanel, out_features);
  const float* b = tile16::checked_bias(bias, out_features);
  const int64_t M = x.size(0), K = x.size(1);
  auto out = torch::empty({M, out_features}, x.options());
  if (M == 0) return out;
  if (K == 0) return b ? out.copy_(bias->unsqueeze(0).expand({M, out_features})) : out.zero_();
  tile16::over_panels<tile16::kLinearVectors, tile16::kLinearRows, tile16::kPanel, tile16::LinearRows>(
      x.data_ptr<float>(), M, K, packed.data_ptr<float>(), packed.size(0), b, out.data_ptr<float>(), out_features);
  return out;
}

// silu(x G^T) * (x U^T) over a weight packed as [P, K, 2 * kGatedHalf] (gate columns, then the
// same up columns, per panel) with `intermediate` real columns per half: [M, intermediate].
inline torch::Tensor packed_silu_gate_up(const torch::Tensor& x, const torch::Tensor& packed, int64_t intermediate) {
  tile16::check_packed(x, packed, 2 * tile16::kGatedHalf, tile16::kGatedHalf, intermediate);
  const int64_t M = x.size(0), K = x.size(1);
  auto out = torch::empty({M, intermediate}, x.options());
  if (M == 0) return out;
  if (K == 0) return out.zero_();
  tile16::over_panels<2 * tile16::kGatedVectors, tile16::kGatedRows, tile16::kGatedHalf, tile16::GatedRows>(
      x.data_ptr<float>(), M, K, packed.data_ptr<float>(), packed.size(0), nullptr, out.data_ptr<float>(), intermediate);
  return out;
}

#if defined(BATCHGEN_BF16_DOT)
// The bfloat16 kernels: x [M, K] float32 rounded to bfloat16 here, a weight packed as bfloat16
// pairs [P, ceil(K / 2), width] (int32 units; kernels/linear_cpu.py packs it), products summed
// in float32 and returned in float32 (no rounding of the result to bfloat16).
template <int kVectors, int kRows, int64_t kOutCols, template <int> class Rows>
inline void over_panels_bf16(const torch::Tensor& x, const torch::Tensor& packed, const float* bias, torch::Tensor& out,
                             int64_t out_cols) {
  const int64_t M = x.size(0), K = x.size(1), K2 = packed.size(1);
  std::vector<uint16_t> pairs(M * 2 * K2);
  tile16::to_bf16_pairs(x.data_ptr<float>(), M, K, K2, pairs.data());
  tile16::over_panels<kVectors, kRows, kOutCols, Rows, uint32_t>(
      reinterpret_cast<const uint32_t*>(pairs.data()), M, K2, reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>()),
      packed.size(0), bias, out.data_ptr<float>(), out_cols);
}

// packed_linear with bfloat16 products: x [M, K] float32 times a bfloat16-pair panel weight
// [P, ceil(K / 2), kPanel] with `out_features` real columns, plus an optional float32 bias.
inline torch::Tensor packed_linear_bf16(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features,
                                        const c10::optional<torch::Tensor>& bias) {
  tile16::check_packed(x, packed, tile16::kPanel, tile16::kPanel, out_features, torch::kInt);
  const float* b = tile16::checked_bias(bias, out_features);
  const int64_t M = x.size(0), K = x.size(1);
  auto out = torch::empty({M, out_features}, x.options());
  if (M == 0) return out;
  if (K == 0) return b ? out.copy_(bias->unsqueeze(0).expand({M, out_features})) : out.zero_();
  over_panels_bf16<tile16::kLinearVectors, tile16::kLinearRows, tile16::kPanel, tile16::LinearRows>(x, packed, b, out,
                                                                                                   out_features);
  return out;
}

// packed_silu_gate_up with bfloat16 products (weight packed as bfloat16 pairs, gate then up
// columns per panel).
inline torch::Tensor packed_silu_gate_up_bf16(const torch::Tensor& x, const torch::Tensor& packed, int64_t intermediate) {
  tile16::check_packed(x, packed, 2 * tile16::kGatedHalf, tile16::kGatedHalf, intermediate, torch::kInt);
  const int64_t M = x.size(0), K = x.size(1);
  auto out = torch::empty({M, intermediate}, x.options());
  if (M == 0) return out;
  if (K == 0) return out.zero_();
  over_panels_bf16<2 * tile16::kGatedVectors, tile16::kGatedRows, tile16::kGatedHalf, tile16::GatedRows>(
      x, packed, nullptr, out, intermediate);
  return out;
}
#endif
