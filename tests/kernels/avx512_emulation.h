// A scalar emulation of the AVX-512F intrinsics that kernels/cpu_attention_tile.h uses, so that
// its tile and decode paths run (and are tested) on CPUs without AVX-512. Test builds only:
// kernels/cpu_attention.cpp includes this before the tile header when BATCHGEN_EMULATE_AVX512 is
// defined (tests/kernels/test_attention_cpu_avx512.py builds that variant).
//
// Everything is declared in namespace tile16, so that the tile header's unqualified names find
// these and not the real intrinsics that <immintrin.h> declares at global scope. Each function
// does what Intel's guide says lane by lane (FMAs fused, rounding to nearest even); the
// reductions add in the same tree as GCC's. Aligned loads and stores check their alignment and
// throw (a RuntimeError in Python) where the real instruction would fault.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#ifndef _MM_FROUND_TO_NEAREST_INT
#define _MM_FROUND_TO_NEAREST_INT 0x00
#define _MM_FROUND_NO_EXC 0x08
#endif
#ifndef _CMP_LT_OQ
#define _CMP_LT_OQ 0x11
#endif

namespace tile16 {

struct __m512 {
  float v[16];
};
struct __m512i {
  int32_t v[16];
};
using __mmask16 = uint16_t;

inline void check_aligned(const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) throw std::runtime_error("emulated AVX-512: unaligned load/store");
}

template <class F>
inline __m512 map(F f) {
  __m512 r;
  for (int i = 0; i < 16; ++i) r.v[i] = f(i);
  return r;
}

inline __m512 _mm512_setzero_ps() { return map([](int) { return 0.f; }); }
inline __m512 _mm512_set1_ps(float x) { return map([x](int) { return x; }); }
inline __m512i _mm512_set1_epi32(int32_t x) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.v[i] = x;
  return r;
}
inline __m512 _mm512_loadu_ps(const float* p) {
  __m512 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline __m512 _mm512_load_ps(const float* p) {
  check_aligned(p);
  return _mm512_loadu_ps(p);
}
inline void _mm512_storeu_ps(float* p, __m512 a) { std::memcpy(p, a.v, sizeof a.v); }
inline void _mm512_store_ps(float* p, __m512 a) {
  check_aligned(p);
  _mm512_storeu_ps(p, a);
}
inline __m512 _mm512_add_ps(__m512 a, __m512 b) { return map([&](int i) { return a.v[i] + b.v[i]; }); }
inline __m512 _mm512_sub_ps(__m512 a, __m512 b) { return map([&](int i) { return a.v[i] - b.v[i]; }); }
inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { return map([&](int i) { return a.v[i] * b.v[i]; }); }
inline __m512 _mm512_div_ps(__m512 a, __m512 b) { return map([&](int i) { return a.v[i] / b.v[i]; }); }
// max: the second operand where either is NaN or both are zeros, as MAXPS does.
inline __m512 _mm512_max_ps(__m512 a, __m512 b) { return map([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
inline __m512 _mm512_abs_ps(__m512 a) { return map([&](int i) { return std::fabs(a.v[i]); }); }
inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  return map([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); });
}
inline __m512 _mm512_fnmadd_ps(__m512 a, __m512 b, __m512 c) {
  return map([&](int i) { return std::fma(-a.v[i], b.v[i], c.v[i]); });
}
inline __m512 _mm512_roundscale_ps(__m512 a, int imm) {
  if (imm != (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)) throw std::runtime_error("emulated AVX-512: roundscale mode");
  return map([&](int i) { return std::nearbyint(a.v[i]); });
}
inline __m512i _mm512_cvtps_epi32(__m512 a) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<int32_t>(std::nearbyint(a.v[i]));
  return r;
}
inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) + static_cast<uint32_t>(b.v[i]));
  return r;
}
inline __m512i _mm512_slli_epi32(__m512i a, unsigned int n) {
  __m512i r;
  for (int i = 0; i < 16; ++i) r.v[i] = n > 31 ? 0 : static_cast<int32_t>(static_cast<uint32_t>(a.v[i]) << n);
  return r;
}
inline __m512 _mm512_castsi512_ps(__m512i a) {
  __m512 r;
  std::memcpy(r.v, a.v, sizeof r.v);
  return r;
}
inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int imm) {
  if (imm != _CMP_LT_OQ) throw std::runtime_error("emulated AVX-512: compare predicate");
  __mmask16 m = 0;
  for (int i = 0; i < 16; ++i) m |= static_cast<__mmask16>((a.v[i] < b.v[i]) << i);
  return m;
}
inline bool lane(__mmask16 k, int i) { return (k >> i) & 1; }
inline __m512 _mm512_mask_blend_ps(__mmask16 k, __m512 a, __m512 b) {
  return map([&](int i) { return lane(k, i) ? b.v[i] : a.v[i]; });
}
inline __m512 _mm512_mask_mov_ps(__m512 src, __mmask16 k, __m512 a) {
  return map([&](int i) { return lane(k, i) ? a.v[i] : src.v[i]; });
}
inline __m512 _mm512_maskz_mul_ps(__mmask16 k, __m512 a, __m512 b) {
  return map([&](int i) { return lane(k, i) ? a.v[i] * b.v[i] : 0.f; });
}
inline __m512 _mm512_mask_sub_ps(__m512 src, __mmask16 k, __m512 a, __m512 b) {
  return map([&](int i) { return lane(k, i) ? a.v[i] - b.v[i] : src.v[i]; });
}
// GCC's reductions: halves combined 16 -> 8 -> 4 -> 2 -> 1.
template <class F>
inline float reduce(__m512 a, F f) {
  float x[16];
  std::memcpy(x, a.v, sizeof x);
  for (int width = 8; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) x[i] = f(x[i + width], x[i]);
  }
  return x[0];
}
inline float _mm512_reduce_add_ps(__m512 a) {
  return reduce(a, [](float hi, float lo) { return hi + lo; });
}
inline float _mm512_reduce_max_ps(__m512 a) {
  return reduce(a, [](float hi, float lo) { return hi > lo ? hi : lo; });
}

}  // namespace tile16
