// The AVX-512F intrinsics that kernels/cpu_attention_tile.h uses, for CPUs with AVX2 and FMA but
// no AVX-512: a 16-lane vector is two 8-lane AVX2 halves (`lo`: lanes 0-7, `hi`: lanes 8-15), and
// each operation runs on both. cpu_attention.cpp includes this before the tile header when the
// CPU has AVX2 and FMA but not AVX-512 (or when BATCHGEN_TILE16_AVX2 forces it, in the test build
// that runs this path on an AVX-512 CPU).
//
// Everything is declared in namespace tile16, so that the tile header's unqualified names find
// these and not the real intrinsics that <immintrin.h> declares at global scope (the scalar
// emulation in tests/kernels/avx512_emulation.h does the same). Lane for lane each function gives
// what the AVX-512 instruction gives: the same fused multiply-adds, the same rounding; the
// reductions combine halves in the same tree as GCC's (16 -> 8 -> 4 -> 2 -> 1), so a row's
// arithmetic is that of the AVX-512 build. Only two immediates are used by the tile header, and
// only those are offered: rounding to nearest (roundscale) and "less than" (compare).
//
// AVX2 has 16 vector registers where AVX-512 has 32, and each 16-lane value here takes two: the
// tile header sizes its micro-tiles from kVectorRegisters below.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace tile16 {

constexpr int kVectorRegisters = 16;

struct __m512 {
  __m256 lo, hi;
};
struct __m512i {
  __m256i lo, hi;
};
using __mmask16 = uint16_t;

inline __m512 _mm512_setzero_ps() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline __m512 _mm512_set1_ps(float x) {
  const __m256 v = _mm256_set1_ps(x);
  return {v, v};
}
inline __m512i _mm512_set1_epi32(int32_t x) {
  const __m256i v = _mm256_set1_epi32(x);
  return {v, v};
}
inline __m512 _mm512_loadu_ps(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
// A 64-byte-aligned address has 32-byte-aligned halves; a misaligned one faults, as on AVX-512.
inline __m512 _mm512_load_ps(const float* p) { return {_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
inline void _mm512_storeu_ps(float* p, __m512 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline void _mm512_store_ps(float* p, __m512 a) {
  _mm256_store_ps(p, a.lo);
  _mm256_store_ps(p + 8, a.hi);
}
inline __m512 _mm512_add_ps(__m512 a, __m512 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline __m512 _mm512_sub_ps(__m512 a, __m512 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline __m512 _mm512_div_ps(__m512 a, __m512 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
// MAXPS in both: the second operand where either is NaN or both are zeros.
inline __m512 _mm512_max_ps(__m512 a, __m512 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline __m512 _mm512_abs_ps(__m512 a) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  return {_mm256_andnot_ps(sign, a.lo), _mm256_andnot_ps(sign, a.hi)};
}
inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline __m512 _mm512_fnmadd_ps(__m512 a, __m512 b, __m512 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
// Rounds to the nearest integer, ties to even: the tile header's one mode
// (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), which the argument names.
inline __m512 _mm512_roundscale_ps(__m512 a, int /*nearest*/) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, kNearest), _mm256_round_ps(a.hi, kNearest)};
}
// Under the default rounding mode (nearest), as the AVX-512 conversion.
inline __m512i _mm512_cvtps_epi32(__m512 a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
  return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)};
}
inline __m512i _mm512_slli_epi32(__m512i a, unsigned int n) {
  const __m128i count = _mm_cvtsi32_si128(static_cast<int>(n));
  return {_mm256_sll_epi32(a.lo, count), _mm256_sll_epi32(a.hi, count)};
}
inline __m512 _mm512_castsi512_ps(__m512i a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
// a < b (ordered, quiet) lane by lane: the tile header's one predicate (_CMP_LT_OQ), which the
// argument names.
inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int /*less_than*/) {
  const int lo = _mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, _CMP_LT_OQ));
  const int hi = _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, _CMP_LT_OQ));
  return static_cast<__mmask16>(lo | (hi << 8));
}
// Lanes whose bit of k is set, as all-ones lanes of two halves.
inline __m512 mask_lanes(__mmask16 k) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i lo = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(k & 0xff), bits), bits);
  const __m256i hi = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(k >> 8), bits), bits);
  return {_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)};
}
// b where k is set, a elsewhere.
inline __m512 _mm512_mask_blend_ps(__mmask16 k, __m512 a, __m512 b) {
  const __m512 m = mask_lanes(k);
  return {_mm256_blendv_ps(a.lo, b.lo, m.lo), _mm256_blendv_ps(a.hi, b.hi, m.hi)};
}
inline __m512 _mm512_mask_mov_ps(__m512 src, __mmask16 k, __m512 a) { return _mm512_mask_blend_ps(k, src, a); }
inline __m512 _mm512_maskz_mul_ps(__mmask16 k, __m512 a, __m512 b) {
  const __m512 m = mask_lanes(k);
  const __m512 p = _mm512_mul_ps(a, b);
  return {_mm256_and_ps(m.lo, p.lo), _mm256_and_ps(m.hi, p.hi)};
}
inline __m512 _mm512_mask_sub_ps(__m512 src, __mmask16 k, __m512 a, __m512 b) {
  return _mm512_mask_blend_ps(k, src, _mm512_sub_ps(a, b));
}
// GCC's tree: hi + lo (16 -> 8), then the upper and lower 128 bits (8 -> 4), then 4 -> 2 -> 1;
// `wide` and `narrow` are one operation (add or max) on 8 and on 4 lanes.
template <class Wide, class Narrow>
inline float reduce(__m512 a, Wide wide, Narrow narrow) {
  const __m256 x8 = wide(a.hi, a.lo);
  __m128 x = narrow(_mm256_extractf128_ps(x8, 1), _mm256_castps256_ps128(x8));
  x = narrow(_mm_movehl_ps(x, x), x);
  x = narrow(_mm_movehdup_ps(x), x);
  return _mm_cvtss_f32(x);
}
inline float _mm512_reduce_add_ps(__m512 a) {
  return reduce(a, [](__m256 h, __m256 l) { return _mm256_add_ps(h, l); }, [](__m128 h, __m128 l) { return _mm_add_ps(h, l); });
}
inline float _mm512_reduce_max_ps(__m512 a) {
  return reduce(a, [](__m256 h, __m256 l) { return _mm256_max_ps(h, l); }, [](__m128 h, __m128 l) { return _mm_max_ps(h, l); });
}

}  // namespace tile16
