// Linear layers (y = x W^T + b, float32) over a weight packed once into column panels, for the
// decode step's GEMMs: tens to hundreds of rows against weights far larger than the caches.
//
// Packed layout (kernels/linear_cpu.py packs it): W [N, K] becomes panels [P, K, kPanel], where
// panel p holds output columns p*kPanel .. p*kPanel + kPanel - 1, zero-padded past N, so that the
// kPanel weights of one k are one contiguous run. A micro-kernel keeps kRows rows x kPanel columns
// of the output in vector registers and walks k: load the panel's k-th run (kPanel / 16 vectors),
// broadcast each row's x[r, k], one FMA per accumulator. A panel (K x kPanel floats: 108 KB at
// K = 576, 288 KB at K = 1536) stays in L2 while every block of rows passes over it; x's rows
// stay in L1/L2.
//
// Why not oneDNN's or MKL's packed sgemm: at decode sizes the weights come from memory (a
// SmolLM2 step reads 537 MB of them), and those libraries' kernels wait on it. Here each block of
// rows also asks for its share of the thread's next panel (software prefetch, spread over the
// k loop), so the next panel is in cache when its turn comes. Measured on a 2-core AVX-512 EPYC,
// 30 layers' projections plus the LM head with cold weights: 64 rows 38.0 ms against oneDNN's
// 51.9 (jobs/bench/linear_kernel.py).
//
// Every output element is one chain of FMAs in k order, from zero, plus the bias: no split of k,
// no reordering by row count. So a row's result does not depend on the other rows in the call
// (batch invariance), and the AVX-512 build, the AVX2 halves and the scalar emulation give the
// same bits (lane for lane the same operations).
//
// Threads: torch's intra-op pool, over panels; blocks of kRowBlock rows one after the other, so
// a prefill chunk's x block stays in L2 while the weights stream past it.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tile16 {

#if defined(BATCHGEN_TILE16_HALVES)
// 16 AVX2 registers: 6 rows x 16 columns is 12 accumulators, 2 weight halves, 1 broadcast.
constexpr int kLinearVectors = 1;
constexpr int kLinearRows = 6;
#else
// 32 AVX-512 registers: 8 rows x 48 columns is 24 accumulators, 3 weight vectors, 1 broadcast.
constexpr int kLinearVectors = 3;
constexpr int kLinearRows = 8;
#endif
constexpr int64_t kPanel = 16 * kLinearVectors;
// Rows per pass over the weights: x's block at K = 1536 is 1.5 MB; the measured prefill rate at
// 2048 rows did not improve below 256.
constexpr int64_t kRowBlock = 256;

// Rows [0, R) of x (row stride lda) times one panel `w` into out (row stride ldc, `cols` valid
// columns of this panel), asking for `prefetch_lines` cache lines from `prefetch` on the way.
template <int R>
inline void linear_rows(const float* __restrict x, int64_t lda, const float* __restrict w, int64_t K,
                        const float* __restrict bias, float* __restrict out, int64_t ldc, int64_t cols,
                        const char* prefetch, int64_t prefetch_lines) {
  constexpr int V = kLinearVectors;
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  const int64_t lines_per_k = (prefetch_lines + K - 1) / K;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0, line = k * lines_per_k; j < lines_per_k && line < prefetch_lines; ++j, ++line) {
      __builtin_prefetch(prefetch + line * 64, 0, 3);
    }
    __m512 b[V];
    for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(w + k * kPanel + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * lda + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t c0 = 16 * v;
    if (c0 >= cols) break;
    __m512 add = _mm512_setzero_ps();
    if (bias && c0 + 16 <= cols) {
      add = _mm512_loadu_ps(bias + c0);
    } else if (bias) {  // the panel's last columns: never read past the bias's end
      float tail[16] = {};
      std::memcpy(tail, bias + c0, sizeof(float) * (cols - c0));
      add = _mm512_loadu_ps(tail);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 y = bias ? _mm512_add_ps(acc[r][v], add) : acc[r][v];
      if (c0 + 16 <= cols) {
        _mm512_storeu_ps(out + r * ldc + c0, y);
      } else {
        float tail[16];
        _mm512_storeu_ps(tail, y);
        std::memcpy(out + r * ldc + c0, tail, sizeof(float) * (cols - c0));
      }
    }
  }
}

// Rows [0, m) against one panel, in blocks of kLinearRows; block i prefetches the i-th share of
// `next` (the thread's next panel, or null).
inline void linear_panel(const float* x, int64_t m, int64_t K, const float* w, const float* bias, float* out,
                         int64_t ldc, int64_t cols, const float* next) {
  const int64_t lines = K * kPanel * static_cast<int64_t>(sizeof(float)) / 64;
  const int64_t blocks = (m + kLinearRows - 1) / kLinearRows;
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t r0 = i * kLinearRows;
    const int64_t rows = std::min<int64_t>(kLinearRows, m - r0);
    const char* pf = next ? reinterpret_cast<const char*>(next) + (lines * i / blocks) * 64 : nullptr;
    const int64_t pf_lines = next ? lines * (i + 1) / blocks - lines * i / blocks : 0;
    const float* xr = x + r0 * K;
    float* o = out + r0 * ldc;
    switch (rows) {
#define BATCHGEN_LINEAR_ROWS(n)                                           \
  case n:                                                                 \
    if constexpr (n <= kLinearRows) linear_rows<n>(xr, K, w, K, bias, o, ldc, cols, pf, pf_lines); \
    break;
      BATCHGEN_LINEAR_ROWS(1) BATCHGEN_LINEAR_ROWS(2) BATCHGEN_LINEAR_ROWS(3) BATCHGEN_LINEAR_ROWS(4)
      BATCHGEN_LINEAR_ROWS(5) BATCHGEN_LINEAR_ROWS(6) BATCHGEN_LINEAR_ROWS(7) BATCHGEN_LINEAR_ROWS(8)
#undef BATCHGEN_LINEAR_ROWS
      default: break;
    }
  }
}

// The gated MLP's first projection fused with its activation: silu(x G^T) * (x U^T) for gate rows
// G and up rows U of one [2n, K] matrix, packed as panels of kGatedHalf gate columns followed by
// the same kGatedHalf up columns (kernels/linear_cpu.py packs them), so that a panel's
// accumulators hold both halves of its outputs and the [M, 2n] product is never written. Each
// product is the same FMA chain as packed_linear's, and silu(g) * u the same arithmetic, lane for
// lane, as silu_and_mul in cpu_small_ops.h: the fused result equals the two ops' bit for bit.
#if defined(BATCHGEN_TILE16_HALVES)
constexpr int kGatedVectors = 1;  // 3 rows x (1 gate + 1 up) x 2 halves = 12 AVX2 accumulators
constexpr int kGatedRows = 3;
#else
constexpr int kGatedVectors = 2;  // 6 rows x (2 gate + 2 up) = 24 AVX-512 accumulators
constexpr int kGatedRows = 6;
#endif
constexpr int64_t kGatedHalf = 16 * kGatedVectors;

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

template <int R>
inline void gated_rows(const float* __restrict x, int64_t lda, const float* __restrict w, int64_t K,
                       float* __restrict out, int64_t ldc, int64_t cols, const char* prefetch, int64_t prefetch_lines) {
  constexpr int V = 2 * kGatedVectors;
  constexpr int64_t width = 2 * kGatedHalf;
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  const int64_t lines_per_k = (prefetch_lines + K - 1) / K;
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t j = 0, line = k * lines_per_k; j < lines_per_k && line < prefetch_lines; ++j, ++line) {
      __builtin_prefetch(prefetch + line * 64, 0, 3);
    }
    __m512 b[V];
    for (int v = 0; v < V; ++v) b[v] = _mm512_loadu_ps(w + k * width + 16 * v);
    for (int r = 0; r < R; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * lda + k]);
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
    }
  }
  for (int v = 0; v < kGatedVectors; ++v) {
    const int64_t c0 = 16 * v;
    if (c0 >= cols) break;
    for (int r = 0; r < R; ++r) {
      const __m512 y = silu_mul(acc[r][v], acc[r][kGatedVectors + v]);
      if (c0 + 16 <= cols) {
        _mm512_storeu_ps(out + r * ldc + c0, y);
      } else {
        float tail[16];
        _mm512_storeu_ps(tail, y);
        std::memcpy(out + r * ldc + c0, tail, sizeof(float) * (cols - c0));
      }
    }
  }
}

inline void gated_panel(const float* x, int64_t m, int64_t K, const float* w, float* out, int64_t ldc, int64_t cols,
                        const float* next) {
  const int64_t lines = K * 2 * kGatedHalf * static_cast<int64_t>(sizeof(float)) / 64;
  const int64_t blocks = (m + kGatedRows - 1) / kGatedRows;
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t r0 = i * kGatedRows;
    const int64_t rows = std::min<int64_t>(kGatedRows, m - r0);
    const char* pf = next ? reinterpret_cast<const char*>(next) + (lines * i / blocks) * 64 : nullptr;
    const int64_t pf_lines = next ? lines * (i + 1) / blocks - lines * i / blocks : 0;
    const float* xr = x + r0 * K;
    float* o = out + r0 * ldc;
    switch (rows) {
#define BATCHGEN_GATED_ROWS(n)                                                          \
  case n:                                                                               \
    if constexpr (n <= kGatedRows) gated_rows<n>(xr, K, w, K, o, ldc, cols, pf, pf_lines); \
    break;
      BATCHGEN_GATED_ROWS(1) BATCHGEN_GATED_ROWS(2) BATCHGEN_GATED_ROWS(3)
      BATCHGEN_GATED_ROWS(4) BATCHGEN_GATED_ROWS(5) BATCHGEN_GATED_ROWS(6)
#undef BATCHGEN_GATED_ROWS
      default: break;
    }
  }
}

}  // namespace tile16

// silu(x G^T) * (x U^T) over a weight packed as [P, K, 2 * kGatedHalf] (see gated_panel) with
// `intermediate` real columns per half: [M, intermediate].
inline torch::Tensor packed_silu_gate_up(const torch::Tensor& x, const torch::Tensor& packed, int64_t intermediate) {
  constexpr int64_t width = 2 * tile16::kGatedHalf;
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kFloat && packed.is_contiguous() &&
                  packed.size(2) == width,
              "packed: contiguous [P, K, ", width, "] float32");
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0);
  TORCH_CHECK(packed.size(1) == K, "x has ", K, " columns, the packed weight ", packed.size(1));
  TORCH_CHECK(intermediate > (P - 1) * tile16::kGatedHalf && intermediate <= P * tile16::kGatedHalf,
              "intermediate ", intermediate, " does not fit ", P, " panels");
  auto out = torch::empty({M, intermediate}, x.options());
  if (M == 0) return out;
  if (K == 0) return out.zero_();
  const float* xs = x.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t panel_size = K * width;
  for (int64_t m0 = 0; m0 < M; m0 += tile16::kRowBlock) {
    const int64_t m = std::min(tile16::kRowBlock, M - m0);
    at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t c0 = p * tile16::kGatedHalf;
        const int64_t cols = std::min<int64_t>(tile16::kGatedHalf, intermediate - c0);
        const float* next = p + 1 < end ? w + (p + 1) * panel_size : nullptr;
        tile16::gated_panel(xs + m0 * K, m, K, w + p * panel_size, o + m0 * intermediate + c0, intermediate, cols,
                            next);
      }
    });
  }
  return out;
}

// x [M, K] (float32, contiguous) times a weight packed as [P, K, kPanel] with `out_features`
// real columns, plus an optional bias [out_features]: [M, out_features].
inline torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out_features,
                                   const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kFloat && packed.is_contiguous() &&
                  packed.size(2) == tile16::kPanel,
              "packed: contiguous [P, K, ", tile16::kPanel, "] float32");
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0);
  TORCH_CHECK(packed.size(1) == K, "x has ", K, " columns, the packed weight ", packed.size(1));
  TORCH_CHECK(out_features > (P - 1) * tile16::kPanel && out_features <= P * tile16::kPanel,
              "out_features ", out_features, " does not fit ", P, " panels");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out_features && bias->scalar_type() == torch::kFloat &&
                    bias->is_contiguous(),
                "bias: contiguous [out_features] float32");
    b = bias->data_ptr<float>();
  }
  auto out = torch::empty({M, out_features}, x.options());
  if (M == 0 || out_features == 0) return out;
  if (K == 0) return b ? out.copy_(bias->unsqueeze(0).expand({M, out_features})) : out.zero_();
  const float* xs = x.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t panel_size = K * tile16::kPanel;
  for (int64_t m0 = 0; m0 < M; m0 += tile16::kRowBlock) {
    const int64_t m = std::min(tile16::kRowBlock, M - m0);
    at::parallel_for(0, P, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const int64_t c0 = p * tile16::kPanel;
        const int64_t cols = std::min<int64_t>(tile16::kPanel, out_features - c0);
        const float* next = p + 1 < end ? w + (p + 1) * panel_size : nullptr;
        tile16::linear_panel(xs + m0 * K, m, K, w + p * panel_size, b ? b + c0 : nullptr, o + m0 * out_features + c0,
                             out_features, cols, next);
      }
    });
  }
  return out;
}
