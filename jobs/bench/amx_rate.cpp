// The rate of AMX's bfloat16 tile product (TDPBF16PS: 16 x 16 x 32 multiply-adds into float32)
// on this CPU, per thread, on as many threads as OMP_NUM_THREADS: a short burst with tiles of
// zeros, then eight windows of a quarter second each with tiles of real values (a GEMM's
// sustained load); and what those rates make of a float32 linear layer built from tile products.
//
// A float32 operand v splits exactly into three bfloat16 parts (v0 = v rounded to 8 significant
// bits, v1 = the rest rounded again, v2 = what is left, at most 7 bits), and the six products
// x_i w_j with i + j <= 2 give a float32 product to float32's accuracy (the three dropped are
// below 2^-27 |x w|). So a float32 GEMM on tiles costs six tile products per 16 x 16 x 32 block:
// it beats the FMA kernel (kernels/cpu_linear.h, near `fma_peak.cpp`'s rate) only where the tile
// unit sustains more than six times the FMA units' multiply-adds.
//
// usage: g++ -O2 -march=native -fopenmp jobs/bench/amx_rate.cpp -o /tmp/amx_rate && OMP_NUM_THREADS=2 /tmp/amx_rate
// (needs a CPU with AMX-BF16, Linux 5.16 or later, and a compiler that knows the AMX intrinsics)
//
// Measured 2026-12-05 on the 2-core Intel Xeon (Emerald Rapids) bench VM, both threads: 5.3-6.0 ns
// a product with tiles of zeros (16 cycles, the documented rate), 6.8-9.2 ns with real values, in
// bursts and over two seconds alike: about 1.1 T bf16 multiply-adds a second a thread, so six
// products come to 150-195 G float32 multiply-adds a second a thread against the FMA units' 90 G
// at best (16-lane FMAs at 2 a cycle, `fma_peak.cpp`). But inside a GEMM the products ran at
// 16-19 ns: a float32 linear kernel on six tile products (both operands split, each thread
// splitting its weight panels into tile layout as it went, x's parts loaded a step ahead;
// float32 accuracy: at SmolLM2's shapes 2e-7 to 6e-7 relative error against float64 where the FMA
// kernel has 4e-7 to 1.3e-6; batch invariant) ran SmolLM2's 30 layers of projections at 0.73-0.80x the FMA kernel's
// speed at 64 rows and 0.91-1.14x at 2,048, and this program run right after it measured 16 ns
// with real values. Not kept; a loop of products alone overstates what a kernel gets.
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile products a second on each thread: accumulators 0-3 (four independent chains) from tiles
// 4-7, which hold zeros or `data`'s values.
double products_per_second(const uint16_t* data, bool zeros, long iterations) {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    if (zeros) {
      _tile_zero(4);
      _tile_zero(5);
      _tile_zero(6);
      _tile_zero(7);
    } else {
      _tile_loadd(4, data, 64);
      _tile_loadd(5, data + 512, 64);
      _tile_loadd(6, data + 1024, 64);
      _tile_loadd(7, data + 1536, 64);
    }
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < iterations; ++i) {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 6, 7);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 6, 5);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    alignas(64) static thread_local float sink[256];
    _tile_stored(0, sink, 64);  // the chains' results are used
    total += 4.0 * iterations / secs + sink[0] * 0;
    _tile_release();
  }
  return total / omp_get_max_threads();
}

}  // namespace

int main() {
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0) {
    std::printf("Linux did not give this process AMX tile state (arch_prctl XTILEDATA)\n");
    return 1;
  }
  // Values in [-1, 1) as bfloat16 (the top half of a float32), as activations and weights have.
  alignas(64) static uint16_t data[4 * 512];
  std::mt19937 gen(0);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (auto& v : data) {
    const float f = uniform(gen);
    uint32_t bits;
    __builtin_memcpy(&bits, &f, 4);
    v = static_cast<uint16_t>(bits >> 16);
  }
  const int threads = omp_get_max_threads();
  auto report = [&](const char* what, double rate) {
    const double macs = rate * 16 * 16 * 32;
    std::printf("%d threads, %-24s per thread: %6.2f ns a tile product, %5.0f G bf16 multiply-adds/s; "
                "float32 from six products: %4.0f G multiply-adds/s\n",
                threads, what, 1e9 / rate, macs / 1e9, macs / 6 / 1e9);
  };
  report("zero tiles (burst),", products_per_second(data, true, 2'000'000));
  report("real values (burst),", products_per_second(data, false, 2'000'000));
  for (int window = 1; window <= 8; ++window) {  // about a quarter second each at 7-19 ns a product
    char what[32];
    std::snprintf(what, sizeof what, "real values (window %d),", window);
    report(what, products_per_second(data, false, 8'000'000));
  }
}
