// The prefill tile of the CPU paged attention with AVX-512 (included by cpu_attention.cpp).
//
// A prefill item has many query rows (tile tokens x the KV head's group of q heads) against the
// same K/V blocks, so it is compute-bound, and the per-row dot products of the generic path
// (cpu_attention.cpp, run_item) leave most of the FMA units idle. Here each block of 16 keys is
// one 16-lane vector, and the pool stores each block's K transposed per head (see
// cpu_attention.cpp), so a K row of the block is a vector of 16 keys:
//
//   kt = K_block^T               [D, 16]   as stored in the pool
//   s_r = q_r . kt               [16]      12 rows at a time: one kt load feeds 12 FMAs
//   soft cap (when asked)        s = cap * tanh(s / cap)
//   online softmax per row       (mask keys outside the row's lo .. pos, running max m, sum l)
//   acc_r = acc_r * alpha_r + p_r . V_block   4 rows at a time: one V load feeds 4 FMAs
//
// Requires block_size == 16 and head_dim % 16 == 0 (the dispatcher falls back otherwise).
// Uses AVX-512F only (no DQ: masks and integer ops where DQ's float logic would be shorter).
// cpu_attention.cpp includes it after defining ScoreRule (the scale, soft cap and window) and
// lane_sum.
// On CPUs with AVX2 and FMA but no AVX-512, cpu_vec16_avx2.h is included first: it declares the
// intrinsics used here in namespace tile16 over pairs of AVX2 vectors, hiding the real ones, and
// the micro-tiles shrink to its 16 registers (kVectorRegisters). Test builds include a scalar
// emulation the same way (tests/kernels/avx512_emulation.h).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace tile16 {

// The micro-tiles are sized to the vector registers: 32 with AVX-512 (and its emulation), 16 where
// one 16-lane vector is two AVX2 halves (cpu_vec16_avx2.h, which defines kVectorRegisters = 16).
// A row's arithmetic does not depend on these sizes, only how many rows share each load.
#if !defined(BATCHGEN_TILE16_HALVES)
constexpr int kVectorRegisters = 32;
#endif
constexpr bool kWide = kVectorRegisters >= 32;
constexpr int kRows = kWide ? 12 : 3;       // query rows per score micro-tile (2 accumulators each)
constexpr int kPvRows = kWide ? 4 : 2;      // rows per P V pass in run
constexpr int kPvColumns = kWide ? 4 : 2;   // 16-float columns per P V pass
constexpr int kDecodeRows = kWide ? 6 : 3;  // decode rows per decode_rows call (4 accumulators each)

// exp(x) for x <= 0, 16 lanes; the same polynomial as exp_neg in cpu_attention.cpp.
inline __m512 exp_neg(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 is_tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mul_ps(static_cast<__mmask16>(~is_tiny), p, _mm512_castsi512_ps(e));
}

// expm1(x) for x <= 0, 16 lanes: exp_neg's reduction x = n ln2 + r and polynomial, but
// 2^n (e^r - 1) + (2^n - 1) with e^r - 1 = r + r^2 P(r) formed directly, so that a small |x|
// (n = 0) keeps its relative precision where exp(x) - 1 would lose it to cancellation.
inline __m512 expm1_neg(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));  // 2^n stays a normal float
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 em1 = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);  // e^r - 1
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 two_n = _mm512_castsi512_ps(e);
  return _mm512_fmadd_ps(two_n, em1, _mm512_sub_ps(two_n, _mm512_set1_ps(1.0f)));
}

// cap * tanh(s / cap), 16 lanes: tanh|u| = -e / (2 + e) with e = expm1(-2|u|), the sign put
// back; a few ulp of relative error, also for small |u|. The same arithmetic as soft_cap8 in
// cpu_attention.cpp, lane for lane.
inline __m512 soft_cap(__m512 s, float cap, float inv_cap) {
  const __m512 u = _mm512_mul_ps(s, _mm512_set1_ps(inv_cap));
  const __m512 e = expm1_neg(_mm512_mul_ps(_mm512_abs_ps(u), _mm512_set1_ps(-2.0f)));
  const __m512 t = _mm512_div_ps(_mm512_sub_ps(_mm512_setzero_ps(), e), _mm512_add_ps(e, _mm512_set1_ps(2.0f)));
  const __m512 capped = _mm512_mul_ps(t, _mm512_set1_ps(cap));
  const __mmask16 negative = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_sub_ps(capped, negative, _mm512_setzero_ps(), capped);
}

// scale * s, soft-capped when the rule asks.
inline __m512 shape_scores(__m512 s, const ScoreRule& rule) {
  s = _mm512_mul_ps(s, _mm512_set1_ps(rule.scale));
  return rule.has_cap ? soft_cap(s, rule.cap, rule.inv_cap) : s;
}

// Scores of R rows (R <= 12) against the span's 32 keys: s[2r], s[2r + 1] = kt^T q_r, kt = the
// span's two blocks' K transposed side by side ([D, 32]). Each of the D steps loads two kt
// vectors and broadcasts each row's q element once: 2R FMAs for R + 2 loads. Out of line on purpose: where GCC inlined it into run's lambda (seen in a standalone
// build), it stored all 2R accumulators to the caller's s[] on every D step, bound by the one
// store port (28.5 against 43.7 flops a cycle for the whole tile).
template <int R>
__attribute__((noinline)) void scores(const float* const* q, const float* kt, int64_t head_dim, __m512* s) {
  __m512 acc[2 * R];
  for (int i = 0; i < 2 * R; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    const __m512 k0 = _mm512_load_ps(kt + d * 32);
    const __m512 k1 = _mm512_load_ps(kt + d * 32 + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 qv = _mm512_set1_ps(q[r][d]);
      acc[2 * r] = _mm512_fmadd_ps(qv, k0, acc[2 * r]);
      acc[2 * r + 1] = _mm512_fmadd_ps(qv, k1, acc[2 * r + 1]);
    }
  }
  for (int i = 0; i < 2 * R; ++i) s[i] = acc[i];
}

// _mm512_loadu_ps into a register of its own. GCC folds a plain load into each FMA that uses it,
// which in pv below is R loads of one V vector where one will do (measured: a prefill tile's
// P V pass issued 20 loads per 16 FMAs and waited on the load ports).
inline __m512 load_kept(const float* p) {
#if !defined(BATCHGEN_TILE16_HALVES) && !defined(BATCHGEN_EMULATE_AVX512)
  __m512 v;
  __asm__("vmovups %1, %0" : "=v"(v) : "m"(*reinterpret_cast<const float(*)[16]>(p)));
  return v;
#else
  return _mm512_loadu_ps(p);
#endif
}

// acc_r[c] = acc_r[c] * alpha_r + sum_j p_r[j] v_j[c] for R rows and C 16-float columns; v_j is
// row j of the span: the first block's rows, then the second's.
template <int R, int C>
inline void pv(float* const* acc, const float* alpha, const float* const* p, const float* const* vb,
               const int64_t* counts, int64_t stride) {
  __m512 a[R][C];
  for (int r = 0; r < R; ++r) {
    const __m512 va = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < C; ++c) a[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc[r] + 16 * c), va);
  }
  for (int half = 0; half < 2; ++half) {
    const float* v0 = vb[half];
    for (int64_t j = 0; j < counts[half]; ++j) {
      __m512 v[C];
      for (int c = 0; c < C; ++c) {
        // (kept where the R x C accumulators leave registers for them: not for decode's 6 rows)
        v[c] = R * C + C <= 20 ? load_kept(v0 + j * stride + 16 * c) : _mm512_loadu_ps(v0 + j * stride + 16 * c);
      }
      for (int r = 0; r < R; ++r) {
        const __m512 pj = _mm512_set1_ps(p[r][16 * half + j]);
        for (int c = 0; c < C; ++c) a[r][c] = _mm512_fmadd_ps(pj, v[c], a[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc[r] + 16 * c, a[r][c]);
  }
}

template <int R>
inline void pv_rows(float* const* acc, const float* alpha, const float* const* p, const float* const* vb,
                    const int64_t* counts, int64_t stride, int64_t head_dim) {
  for (int64_t d0 = 0; d0 < head_dim; d0 += 16 * kPvColumns) {  // up to kPvColumns columns per pass
    float* a[R];
    for (int r = 0; r < R; ++r) a[r] = acc[r] + d0;
    const float* v[2] = {vb[0] + d0, vb[1] + d0};
    switch (std::min<int64_t>(kPvColumns, (head_dim - d0) / 16)) {
      case 4: pv<R, 4>(a, alpha, p, v, counts, stride); break;
      case 3: pv<R, 3>(a, alpha, p, v, counts, stride); break;
      case 2: pv<R, 2>(a, alpha, p, v, counts, stride); break;
      default: pv<R, 1>(a, alpha, p, v, counts, stride); break;
    }
  }
}

// Asks for the cache lines of one block's K and V of one KV head (16 x head_dim floats each,
// contiguous in the pool), into L1 (Locality 3) or L2 (2).
template <int Locality = 3>
inline void prefetch_block(const float* k, const float* v, int64_t head_dim) {
  for (int64_t i = 0; i < 16 * head_dim; i += 16) {  // 16 floats = one 64-byte line
    __builtin_prefetch(k + i, 0, Locality);
    __builtin_prefetch(v + i, 0, Locality);
  }
}

// Scores of R <= 6 decode rows against one block's 16 keys, kt = the block's K transposed
// ([D, 16]): s[r] = kt^T q_r, unscaled. Each row keeps four partial sums (d mod 4), so that even
// one sequence's rows (R = 3) keep 12 FMA chains in flight; they are added as (s0 + s1) +
// (s2 + s3). A row's arithmetic does not depend on R or on the rows beside it.
template <int R>
inline void block_scores(const float* const* q, const float* kt, int64_t head_dim, __m512* s,
                         const float* next_kt, const float* next_vb) {
  __m512 a[R][4];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < 4; ++c) a[r][c] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < head_dim; d += 4) {
    if (next_kt != nullptr) {  // a line of K and one of V per K row: the whole next block by the loop's end
      for (int c = 0; c < 4; ++c) {
        __builtin_prefetch(next_kt + (d + c) * 16, 0, 3);
        __builtin_prefetch(next_vb + (d + c) * 16, 0, 3);
      }
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 k = _mm512_loadu_ps(kt + (d + c) * 16);
      for (int r = 0; r < R; ++r) a[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d + c]), k, a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) s[r] = _mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]), _mm512_add_ps(a[r][2], a[r][3]));
}

// One block's keys first .. n - 1 (0 <= first < n <= 16) for R <= 6 decode rows that all see
// those keys (one or more sequences' q heads of a KV head; first > 0 where a sliding window
// starts inside the block): kt = the block's K transposed ([D, 16]), vb = its V rows ([16, D]).
// Per row r: query q[r], running max m[r], running sum l[16 r .. 16 r + 15] kept per lane (a key
// lane's share, added by lane_sum after the last block), unnormalized
// output acc[r][head_dim]. Each kt and V load feeds R FMAs. A row's arithmetic is the same whatever
// rows run beside it, so its output does not depend on the batch or on which sequences share
// its blocks.
template <int R>
inline void decode_rows(const float* const* q, const float* kt, const float* vb, int64_t first, int64_t n,
                        int64_t head_dim, const ScoreRule& rule, float* m, float* l, float* const* acc,
                        const float* next_kt, const float* next_vb) {
  __m512 sc[R];
  block_scores<R>(q, kt, head_dim, sc, next_kt, next_vb);
  const uint32_t below_n = n >= 16 ? 0xFFFFu : (1u << n) - 1u;
  const __mmask16 valid = static_cast<__mmask16>(below_n & ~((1u << first) - 1u));
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  alignas(64) float p[R][16];
  float alpha[R];
  const float* p_rows[R];
  // Every row's new running max first, then the rows' rescale factors in one vector exp: a
  // scalar std::exp per row is a libm call with the live vectors spilled around it.
  alignas(64) float m_new[R], dm[16] = {};  // dm padded to one vector
  for (int r = 0; r < R; ++r) {
    sc[r] = _mm512_mask_blend_ps(valid, minus_inf, shape_scores(sc[r], rule));
    m_new[r] = std::max(m[r], _mm512_reduce_max_ps(sc[r]));
    dm[r] = m[r] - m_new[r];  // -inf on a row's first block: exp_neg gives 0, as exp does
  }
  _mm512_store_ps(dm, exp_neg(_mm512_load_ps(dm)));
  for (int r = 0; r < R; ++r) {
    alpha[r] = dm[r];
    const __m512 e = exp_neg(_mm512_sub_ps(sc[r], _mm512_set1_ps(m_new[r])));
    _mm512_store_ps(p[r], e);
    _mm512_storeu_ps(l + 16 * r, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l + 16 * r), _mm512_set1_ps(alpha[r])), e));
    m[r] = m_new[r];
    p_rows[r] = p[r] + first;  // lanes below first hold 0: P V starts at key first
  }
  const float* v_halves[2] = {vb + first * head_dim, vb};
  const int64_t counts[2] = {n - first, 0};
  pv_rows<R>(acc, alpha, p_rows, v_halves, counts, head_dim, head_dim);
}

// decode_rows for a runtime row count 1 <= rows <= kDecodeRows.
inline void decode_rows_n(int64_t rows, const float* const* q, const float* kt, const float* vb, int64_t first,
                          int64_t n, int64_t head_dim, const ScoreRule& rule, float* m, float* l,
                          float* const* acc, const float* next_kt = nullptr, const float* next_vb = nullptr) {
  switch (rows) {
    case 6: decode_rows<6>(q, kt, vb, first, n, head_dim, rule, m, l, acc, next_kt, next_vb); break;
    case 5: decode_rows<5>(q, kt, vb, first, n, head_dim, rule, m, l, acc, next_kt, next_vb); break;
    case 4: decode_rows<4>(q, kt, vb, first, n, head_dim, rule, m, l, acc, next_kt, next_vb); break;
    case 3: decode_rows<3>(q, kt, vb, first, n, head_dim, rule, m, l, acc, next_kt, next_vb); break;
    case 2: decode_rows<2>(q, kt, vb, first, n, head_dim, rule, m, l, acc, next_kt, next_vb); break;
    default: decode_rows<1>(q, kt, vb, first, n, head_dim, rule, m, l, acc, next_kt, next_vb); break;
  }
}

// One item: `rows` query rows (row r -> query pointer q_rows[r], keys lo[r] .. pos[r], output
// out_rows[r]) over the blocks of one KV head, two blocks (a span of 32 keys) at a time, from
// the block of the lowest lo (blocks below every row's window are never read).
// kb(b) gives block b's K of the head transposed ([D, 16]), vb(b) its V rows ([16, D]).
template <class BlockK, class BlockV>
void run(int64_t rows, const float* const* q_rows, const int64_t* pos, const int64_t* lo, float* const* out_rows,
         int64_t num_blocks, BlockK kb, BlockV vb, int64_t head_dim, const ScoreRule& rule,
         std::vector<float>& scratch) {
  constexpr int64_t B = 16, S = 32;  // keys per block, per span
  const int64_t padded = (rows + kRows - 1) / kRows * kRows;
  scratch.assign(16 + head_dim * S + padded * head_dim + padded * S + padded * 18, 0.f);
  float* base = scratch.data();
  // kt first: _mm512_load_ps needs 64-byte alignment.
  float* kt = base + (16 - (reinterpret_cast<uintptr_t>(base) / sizeof(float)) % 16) % 16;  // [D, S]
  float* acc = kt + head_dim * S;         // [padded, head_dim]
  float* pbuf = acc + padded * head_dim;  // [padded, S]
  float* l = pbuf + padded * S;  // [padded, 16]: each row's running sum per key lane (lane_sum)
  float* m = l + padded * 16;
  float* alpha = m + padded;
  for (int64_t r = 0; r < padded; ++r) m[r] = -std::numeric_limits<float>::infinity();
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t max_pos = *std::max_element(pos, pos + rows);
  const int64_t min_lo = *std::min_element(lo, lo + rows);
  for (int64_t b = min_lo / B; b < num_blocks; b += 2) {
    const int64_t first = b * B;
    const int64_t n = std::min<int64_t>(S, max_pos + 1 - first);  // keys in this span
    const int64_t counts[2] = {std::min<int64_t>(B, n), std::max<int64_t>(0, n - B)};
    // kt = the span's two transposed blocks side by side, in one aligned buffer that the
    // micro-tiles below share (measured: reading the two blocks in the pool directly made a
    // prefill step's attention up to 1.9x slower). Lanes past n hold whatever the pool holds
    // there; the masks below drop them.
    const float* kt0 = kb(b);
    const float* kt1 = counts[1] > 0 ? kb(b + 1) : kt0;
    for (int64_t d = 0; d < head_dim; ++d) {
      _mm512_store_ps(kt + d * S, _mm512_loadu_ps(kt0 + d * B));
      _mm512_store_ps(kt + d * S + B, _mm512_loadu_ps(kt1 + d * B));
    }
    const float* vspan[2] = {vb(b), counts[1] > 0 ? vb(b + 1) : nullptr};
    for (int64_t nb = b + 2; nb < std::min(b + 4, num_blocks); ++nb) {
      prefetch_block(kb(nb), vb(nb), head_dim);  // the next span is anywhere in the pool
    }
    int64_t active = 0;  // rows with at least one visible key, gathered for the micro-tile
    const float* q_act[kRows];
    int64_t r_act[kRows];
    uint32_t bits_act[kRows];  // the row's visible keys of the span, one bit each
    auto flush = [&](int64_t count) {
      __m512 s[24];
      switch (count) {
        case 12: scores<12>(q_act, kt, head_dim, s); break;
        case 11: scores<11>(q_act, kt, head_dim, s); break;
        case 10: scores<10>(q_act, kt, head_dim, s); break;
        case 9: scores<9>(q_act, kt, head_dim, s); break;
        case 8: scores<8>(q_act, kt, head_dim, s); break;
        case 7: scores<7>(q_act, kt, head_dim, s); break;
        case 6: scores<6>(q_act, kt, head_dim, s); break;
        case 5: scores<5>(q_act, kt, head_dim, s); break;
        case 4: scores<4>(q_act, kt, head_dim, s); break;
        case 3: scores<3>(q_act, kt, head_dim, s); break;
        case 2: scores<2>(q_act, kt, head_dim, s); break;
        default: scores<1>(q_act, kt, head_dim, s); break;
      }
      // Running maxima first, then every row's rescale factor in one vector exp (as in
      // decode_rows).
      alignas(64) float m_new[16], dm[16] = {};
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = r_act[i];
        const uint32_t bits = bits_act[i];
        s[2 * i] = _mm512_mask_mov_ps(neg_inf, static_cast<__mmask16>(bits), shape_scores(s[2 * i], rule));
        s[2 * i + 1] = _mm512_mask_mov_ps(neg_inf, static_cast<__mmask16>(bits >> 16), shape_scores(s[2 * i + 1], rule));
        m_new[i] = std::max(m[r], _mm512_reduce_max_ps(_mm512_max_ps(s[2 * i], s[2 * i + 1])));
        dm[i] = m[r] - m_new[i];
      }
      _mm512_store_ps(dm, exp_neg(_mm512_load_ps(dm)));
      for (int64_t i = 0; i < count; ++i) {
        const int64_t r = r_act[i];
        alpha[r] = dm[i];
        const __m512 vm = _mm512_set1_ps(m_new[i]);
        const __m512 p0 = exp_neg(_mm512_sub_ps(s[2 * i], vm));
        const __m512 p1 = exp_neg(_mm512_sub_ps(s[2 * i + 1], vm));
        _mm512_storeu_ps(pbuf + r * S, p0);
        _mm512_storeu_ps(pbuf + r * S + B, p1);
        _mm512_storeu_ps(l + 16 * r, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(l + 16 * r), _mm512_set1_ps(alpha[r])),
                                                   _mm512_add_ps(p0, p1)));
        m[r] = m_new[i];
      }
    };
    for (int64_t r = 0; r < rows; ++r) {
      // The row's keys in the span: from its window's start to its causal limit.
      const int64_t start = std::max<int64_t>(0, lo[r] - first);
      const int64_t visible = std::min<int64_t>(n, pos[r] + 1 - first);
      if (visible <= start) {  // nothing visible: P V below leaves the row as it is
        alpha[r] = 1.f;
        for (int64_t j = 0; j < S; ++j) pbuf[r * S + j] = 0.f;
        continue;
      }
      const uint32_t below = visible >= 32 ? 0xffffffffu : (1u << visible) - 1u;  // 0 <= start < visible <= 32
      q_act[active] = q_rows[r];
      r_act[active] = r;
      bits_act[active] = below & ~((1u << start) - 1u);
      if (++active == kRows) {
        flush(kRows);
        active = 0;
      }
    }
    if (active > 0) flush(active);
    int64_t r = 0;  // P V for every row, kPvRows at a time
    for (; r + kPvRows <= rows; r += kPvRows) {
      float* a[kPvRows];
      const float* p[kPvRows];
      for (int i = 0; i < kPvRows; ++i) a[i] = acc + (r + i) * head_dim, p[i] = pbuf + (r + i) * S;
      pv_rows<kPvRows>(a, alpha + r, p, vspan, counts, head_dim, head_dim);
    }
    for (; r < rows; ++r) {
      float* a[1] = {acc + r * head_dim};
      const float* p[1] = {pbuf + r * S};
      pv_rows<1>(a, alpha + r, p, vspan, counts, head_dim, head_dim);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float sum = lane_sum(l + 16 * r);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const float* a = acc + r * head_dim;
    float* o = out_rows[r];
    for (int64_t d = 0; d < head_dim; ++d) o[d] = a[d] * inv;
  }
}

}  // namespace tile16
