// This CPU's peak rate for the instructions batchgen's CPU kernels are made of: 16-lane float32
// FMA (the packed linear kernel), AVX512-BF16 dot products (the greedy screen's estimate) and
// AVX512-VNNI u8 x s8 dot products (what an int8 estimate would use), per thread, on as many
// threads as OMP_NUM_THREADS. Twelve independent chains a thread, each from its own start value
// (identical chains let the compiler fold them into one), so only the issue rate limits.
//
// usage: g++ -O2 -march=native -fopenmp jobs/bench/fma_peak.cpp -o /tmp/fma_peak && OMP_NUM_THREADS=2 /tmp/fma_peak
// (needs a CPU and compiler with AVX512-BF16 and AVX512-VNNI)
//
// Measured 2026-12-05 on the 2-core AMD EPYC bench VM, both threads, five runs: float32 525-572
// GFLOP/s (8.2-8.9 G FMAs a second a thread: the clock moves), bfloat16 dot products 508-527 G
// multiply-adds a second, VNNI dot products 1,110-1,145 G.
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdio>

enum Kind { kFma, kBf16, kVnni };

template <Kind kind>
double instructions_per_second(long iterations, int seed) {
  double sink = 0;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
  {
    __m512 f[12];
    __m512i a[12];
    for (int i = 0; i < 12; ++i) f[i] = _mm512_set1_ps(seed + i), a[i] = _mm512_set1_epi32(seed + i);
    const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-4f);
    const __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(1);
    const __m512bh bx = (__m512bh)_mm512_set1_epi16(0x3f00), by = (__m512bh)_mm512_set1_epi16(0);
    for (long n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
      for (int i = 0; i < 12; ++i) {
        if constexpr (kind == kFma) f[i] = _mm512_fmadd_ps(f[i], m, c);
        if constexpr (kind == kBf16) f[i] = _mm512_dpbf16_ps(f[i], bx, by);
        if constexpr (kind == kVnni) a[i] = _mm512_dpbusd_epi32(a[i], x, y);
      }
    }
    __m512 t = _mm512_setzero_ps();
    __m512i u = _mm512_setzero_si512();
    for (int i = 0; i < 12; ++i) t = _mm512_add_ps(t, f[i]), u = _mm512_add_epi32(u, a[i]);
    sink += _mm512_reduce_add_ps(t) + _mm512_reduce_add_epi32(u);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (sink == 0.125) std::printf(" ");  // keeps the chains' results alive
  return iterations * 12.0 / seconds;
}

int main(int argc, char**) {
  const long iterations = 100000000;
  const int threads = omp_get_max_threads();
  const double fma = instructions_per_second<kFma>(iterations, argc);
  const double bf16 = instructions_per_second<kBf16>(iterations, argc);
  const double vnni = instructions_per_second<kVnni>(iterations, argc);
  std::printf("%d threads, per thread: FMA %.2f G/s, bf16 dot %.2f G/s, VNNI dot %.2f G/s\n", threads, fma / 1e9,
              bf16 / 1e9, vnni / 1e9);
  std::printf("all threads: float32 %.0f GFLOP/s, bf16 %.0f G multiply-adds/s, int8 %.0f G multiply-adds/s\n",
              threads * fma * 32 / 1e9, threads * bf16 * 32 / 1e9, threads * vnni * 64 / 1e9);
}
