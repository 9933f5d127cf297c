// Paged attention on the CPU, reading K/V in place from the block pool (float32); the per-layer
// small ops (RMSNorm, rotary embedding, SiLU-and-multiply) come from cpu_small_ops.h.
//
// One work item = (sequence, KV head, tile of up to kTileQ query tokens). Its query rows are
// the tile's tokens times the q heads of the KV head's group (grouped-query attention shares
// each K/V load across the group). K/V blocks are visited one at a time through the block
// table with an online softmax, so nothing is gathered or padded:
//
//   seq s:  | context (cached) ............ | chunk (q_len tokens) |
//   query token i sits at position p = seq_len - q_len + i and sees keys lo .. p, where
//   lo = max(0, p - window + 1) with a sliding window and 0 without one.
//
// Blocks wholly below a row's lo are not read at all (a long context under a small window
// costs the window, not the context); lo inside a block masks the keys below it. Scores are
// scale * q.k, then cap * tanh(score / cap) with a logit soft cap (Gemma 2), before the mask.
//
// The pools are laid out for these loops (the tensors keep the shape [num_blocks, block_size,
// KVH, D] of every backend, as strided views; kernels.new_kv_cache allocates them):
//
//   K: stored [num_blocks, KVH, D, block_size]: each (block, head) is the block's K transposed,
//      so one row of it is one element of 16 keys, a vector: q . k for a whole block is D
//      broadcast-FMAs, with no horizontal sums, for any number of query rows at once;
//   V: stored [num_blocks, KVH, block_size, D]: each (block, head) is its 16 V rows.
//
// Either is one contiguous 4 KB piece per (block, head) at D = 64, block_size = 16.
//
// Items run on torch's intra-op thread pool (at::parallel_for), so they share its threads with
// the GEMMs; each thread pulls the next item from an atomic counter, largest items first, since
// sequence lengths differ widely within a batch.
//
// Prefill items (at least kMinTileRows query rows) take the tile path of cpu_attention_tile.h
// where the CPU has AVX-512, or AVX2 and FMA (16-lane vectors as two AVX2 halves,
// cpu_vec16_avx2.h), block_size is 16 and head_dim a multiple of 16: there the rows share each
// K/V block as a small GEMM. Other CPUs use run_item below.
//
// Decode sequences (one query token) run as slices of the batch sorted by block table
// (run_decode_slice): sequences that share prefix blocks, as a multi-turn batch's do, read each
// shared block once and compute it for all their rows. On the tile path's CPUs the rows go
// through tile16::decode_rows, up to 6 at a time (3 with AVX2), otherwise through run_item's
// per-row functions.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// How a query row's scores are formed and which keys it sees (see the top of this file).
struct ScoreRule {
  float scale;
  bool has_cap;
  float cap, inv_cap;
  bool has_window;
  int64_t window;
  // The first key position a query at position pos sees.
  int64_t lo(int64_t pos) const { return has_window ? std::max<int64_t>(0, pos - window + 1) : 0; }
};

// A row's softmax sum kept per key lane, 16 floats (the tile paths: tile16::decode_rows and
// tile16::run add each block's exponentials lane by lane), added once after its last block: lanes
// 0 .. 15 in order, scalar, so that every build (AVX-512, AVX2 halves, the emulation) gives the same
// bits. Keeping the lanes apart saves a horizontal add per row and block, a chain of shuffles the
// softmax waited on (a prefill tile 4-7% faster).
inline float lane_sum(const float* lanes) {
  float sum = 0.f;
  for (int i = 0; i < 16; ++i) sum += lanes[i];
  return sum;
}

#if defined(BATCHGEN_EMULATE_AVX512)
// Test builds only: the AVX-512 paths on a CPU without AVX-512 (tests/kernels/test_attention_cpu_variants.py).
#define BATCHGEN_TILE16 1
#include "avx512_emulation.h"
#include "cpu_attention_tile.h"
#elif defined(__AVX512F__) && !defined(BATCHGEN_TILE16_AVX2)
#define BATCHGEN_TILE16 1
#include "cpu_attention_tile.h"
#elif defined(__AVX2__) && defined(__FMA__)
// The same paths over pairs of AVX2 vectors (BATCHGEN_TILE16_AVX2: also on an AVX-512 CPU, the
// test build of tests/kernels/test_attention_cpu_variants.py).
#define BATCHGEN_TILE16 1
#define BATCHGEN_TILE16_HALVES 1
#include "cpu_vec16_avx2.h"
#include "cpu_attention_tile.h"
#endif

namespace {

constexpr int64_t kTileQ = 16;
// The tile path's K/V transpose and loads are shared by all of an item's rows, so its
// items are larger (measured: 64 tokens beat 16, 32 and 128 on prefill over a cached prefix).
constexpr int64_t kTileQWide = 64;
// Items with at least this many query rows (prefill tiles) take the tile path.
constexpr int64_t kMinTileRows = 8;
// How many runs ahead run_decode_slice asks for a block's lines into L2 (measured on decode
// steps at batch 64 from memory, with the next block's L1 requests spread over the scores'
// loop: 8 and 12 alike, 4 and 16 slower, all faster than none).
constexpr int64_t kL2Ahead = 8;

struct Item {
  int64_t seq;      // -1: a decode slice, the sequences decode[q_begin, q_end) in paged_attention
  int64_t kv_head;
  int64_t q_begin;  // first query token of the tile, relative to the sequence's chunk
  int64_t q_end;
  int64_t cost;
};

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t d = 0; d < n; ++d) acc += a[d] * b[d];
  return acc;
}

#if defined(__AVX2__) && defined(__FMA__)
// exp for x <= 0 (softmax after subtracting the running max): 2^(x log2 e) as 2^n times a
// degree-6 polynomial on [-ln2/2, ln2/2]; relative error about 2e-7. x below -87 gives 0.
inline __m256 exp_neg(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  const __m256 is_tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_andnot_ps(is_tiny, y);
}

// expm1(x) for x <= 0: exp_neg's reduction and polynomial, with e^r - 1 = r + r^2 P(r) formed
// directly, 2^n (e^r - 1) + (2^n - 1), so that a small |x| keeps its relative precision.
inline __m256 expm1_neg(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // 2^n stays a normal float
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 em1 = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 two_n = _mm256_castsi256_ps(e);
  return _mm256_fmadd_ps(two_n, em1, _mm256_sub_ps(two_n, _mm256_set1_ps(1.0f)));
}

// cap * tanh(s / cap), 8 lanes: tanh|u| = -e / (2 + e) with e = expm1(-2|u|), the sign put
// back (the same arithmetic as tile16::soft_cap).
inline __m256 soft_cap8(__m256 s, float cap, float inv_cap) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 u = _mm256_mul_ps(s, _mm256_set1_ps(inv_cap));
  const __m256 e = expm1_neg(_mm256_mul_ps(_mm256_andnot_ps(sign, u), _mm256_set1_ps(-2.0f)));
  const __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_setzero_ps(), e), _mm256_add_ps(e, _mm256_set1_ps(2.0f)));
  return _mm256_or_ps(_mm256_mul_ps(t, _mm256_set1_ps(cap)), _mm256_and_ps(sign, u));
}

#endif

// s[j] = cap * tanh(s[j] / cap) for j < n.
inline void soft_cap(float* s, int64_t n, float cap, float inv_cap) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, soft_cap8(_mm256_loadu_ps(s + j), cap, inv_cap));
#endif
  for (; j < n; ++j) s[j] = cap * std::tanh(s[j] * inv_cap);
}

// s[j] = scale * q . k_j (soft-capped when the rule asks) for n tokens of a block from the
// block's K transposed (kt[d * block_size + j]; kt + first for the tokens from first on);
// returns their maximum.
inline float block_scores(const float* qr, const float* kt, int64_t block_size, int64_t n, int64_t head_dim,
                          const ScoreRule& rule, float* s) {
  for (int64_t j = 0; j < n; ++j) s[j] = 0.f;
  for (int64_t d = 0; d < head_dim; ++d) {  // one row of kt (n keys) per q element
    const float qd = qr[d];
    const float* row = kt + d * block_size;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] += qd * row[j];
  }
  for (int64_t j = 0; j < n; ++j) s[j] *= rule.scale;
  if (rule.has_cap) soft_cap(s, n, rule.cap, rule.inv_cap);
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) best = std::max(best, s[j]);
  return best;
}

// s[j] = exp(s[j] - m) for j < n; returns their sum.
inline float block_exp(float* s, int64_t n, float m) {
  int64_t j = 0;
  float sum = 0.f;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 vsum = _mm256_setzero_ps();
  const __m256 vm = _mm256_set1_ps(m);
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vsum);
  for (float x : lanes) sum += x;
#endif
  for (; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  return sum;
}

#if defined(__AVX2__) && defined(__FMA__)
// C * 8 columns of a = a * alpha + sum_j p[j] * v_j. C is a compile-time count so that the C
// accumulators stay in registers (a runtime count spills them to the stack on every FMA).
template <int C>
inline void pv_columns(float* a, __m256 va, const float* p, const float* vb, int64_t stride, int64_t n) {
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(a + 8 * c), va);
  for (int64_t j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* vr = vb + j * stride;
    for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vr + 8 * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(a + 8 * c, acc[c]);
}
#endif

// a = a * alpha + sum_j p[j] * v_j over the first n tokens of a block.
inline void block_pv(float* a, float alpha, const float* p, const float* vb, int64_t stride, int64_t n,
                     int64_t head_dim) {
#if defined(__AVX2__) && defined(__FMA__)
  if (head_dim % 8 == 0) {
    const __m256 va = _mm256_set1_ps(alpha);
    for (int64_t d0 = 0; d0 < head_dim; d0 += 64) {  // up to 8 accumulators (64 floats) per pass
      switch (std::min<int64_t>(8, (head_dim - d0) / 8)) {
        case 8: pv_columns<8>(a + d0, va, p, vb + d0, stride, n); break;
        case 7: pv_columns<7>(a + d0, va, p, vb + d0, stride, n); break;
        case 6: pv_columns<6>(a + d0, va, p, vb + d0, stride, n); break;
        case 5: pv_columns<5>(a + d0, va, p, vb + d0, stride, n); break;
        case 4: pv_columns<4>(a + d0, va, p, vb + d0, stride, n); break;
        case 3: pv_columns<3>(a + d0, va, p, vb + d0, stride, n); break;
        case 2: pv_columns<2>(a + d0, va, p, vb + d0, stride, n); break;
        default: pv_columns<1>(a + d0, va, p, vb + d0, stride, n); break;
      }
    }
    return;
  }
#endif
#pragma omp simd
  for (int64_t d = 0; d < head_dim; ++d) a[d] *= alpha;
  for (int64_t j = 0; j < n; ++j) {
    const float pj = p[j];
    const float* vr = vb + j * stride;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) a[d] += pj * vr[d];
  }
}

// One row's online-softmax step over keys first .. visible - 1 of a block (kt: its K
// transposed, vb: its V rows; first > 0 where a sliding window starts inside the block): scores
// into s, then running max m, running sum l and the unnormalized output acc updated.
inline void row_block(const float* qr, const float* kt, const float* vb, int64_t block_size, int64_t first,
                      int64_t visible, int64_t head_dim, const ScoreRule& rule, float* s, float& m, float& l,
                      float* acc) {
  kt += first;              // column first of the transposed block
  vb += first * head_dim;   // row first of V
  visible -= first;
  const float block_max = block_scores(qr, kt, block_size, visible, head_dim, rule, s);
  const float m_new = std::max(m, block_max);
  const float alpha = std::exp(m - m_new);
  l = l * alpha + block_exp(s, visible, m_new);
  m = m_new;
  block_pv(acc, alpha, s, vb, head_dim, visible, head_dim);
}

// Asks for the cache lines of one block's K and V of one KV head (`floats` contiguous floats
// each), into L1 (Locality 3) or L2 (2).
template <int Locality = 3>
inline void prefetch_block(const float* kb, const float* vb, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 16) {  // 16 floats = one 64-byte line
    __builtin_prefetch(kb + i, 0, Locality);
    __builtin_prefetch(vb + i, 0, Locality);
  }
}

// Where block `id`'s K (transposed, [head_dim, block_size]) or V ([block_size, head_dim]) of
// KV head h starts in its pool: both pools hold block_size * head_dim floats per (block, head).
inline int64_t block_offset(int64_t id, int64_t h, int64_t num_kv_heads, int64_t block_size, int64_t head_dim) {
  return (id * num_kv_heads + h) * block_size * head_dim;
}

void run_item(const Item& it, const float* q, int64_t q_stride, float* out, const float* k_cache,
              const float* v_cache, const int32_t* block_table, int64_t seq_len, int64_t q_len, int64_t q_start,
              int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
              const ScoreRule& rule, std::vector<float>& scratch) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t tile = it.q_end - it.q_begin;
  const int64_t rows = tile * group;
  const int64_t context = seq_len - q_len;
  auto offset = [&](int64_t b) { return block_offset(block_table[b], it.kv_head, num_kv_heads, block_size, head_dim); };
#if defined(BATCHGEN_TILE16)
  if (block_size == 16 && head_dim % 16 == 0 && rows >= kMinTileRows) {
    std::vector<const float*> q_rows(rows);
    std::vector<float*> out_rows(rows);
    std::vector<int64_t> pos(rows), lo(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = it.q_begin + r / group;
      const int64_t h = it.kv_head * group + r % group;
      q_rows[r] = q + (q_start + t) * q_stride + h * head_dim;
      out_rows[r] = out + ((q_start + t) * num_heads + h) * head_dim;
      pos[r] = context + t;
      lo[r] = rule.lo(pos[r]);
    }
    auto kb = [&](int64_t b) { return k_cache + offset(b); };
    auto vb = [&](int64_t b) { return v_cache + offset(b); };
    const int64_t num_blocks = (context + it.q_end - 1) / block_size + 1;
    tile16::run(rows, q_rows.data(), pos.data(), lo.data(), out_rows.data(), num_blocks, kb, vb, head_dim, rule,
                scratch);
    return;
  }
#endif
  scratch.assign(rows * head_dim + rows * block_size + rows * 2, 0.f);
  float* acc = scratch.data();                    // [rows, head_dim]
  float* scores = acc + rows * head_dim;          // [rows, block_size]
  float* m = scores + rows * block_size;          // running max per row
  float* l = m + rows;                            // running sum per row
  for (int64_t r = 0; r < rows; ++r) m[r] = -std::numeric_limits<float>::infinity();
  // Query row r = (token t = r / group, head h = kv_head * group + r % group).
  auto q_row = [&](int64_t r) {
    const int64_t t = it.q_begin + r / group;
    const int64_t h = it.kv_head * group + r % group;
    return q + (q_start + t) * q_stride + h * head_dim;
  };
  const int64_t last_pos = context + it.q_end - 1;  // highest key position any row sees
  const int64_t num_blocks = last_pos / block_size + 1;
  const int64_t block_floats = block_size * head_dim;
  // The lowest key position any row sees (the tile's first token's window start): blocks below
  // it are skipped.
  const int64_t first_block = rule.lo(context + it.q_begin) / block_size;
  for (int64_t b = first_block; b < num_blocks; ++b) {
    const int64_t base = b * block_size;
    const int64_t n = std::min(block_size, last_pos + 1 - base);
    const float* kt = k_cache + offset(b);
    const float* vb = v_cache + offset(b);
    if (b + 1 < num_blocks) {
      // The next block sits anywhere in the pool, where no hardware prefetcher can guess it: ask
      // for its K/V lines now, so they arrive while this block is computed.
      prefetch_block(k_cache + offset(b + 1), v_cache + offset(b + 1), block_floats);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q_row(r);
      const int64_t pos = context + it.q_begin + r / group;
      const int64_t visible = std::min(n, pos + 1 - base);  // causal limit inside this block
      const int64_t first = std::max<int64_t>(0, rule.lo(pos) - base);  // window start inside it
      float* s = scores + r * block_size;
      if (visible <= first) continue;
      row_block(qr, kt, vb, block_size, first, visible, head_dim, rule, s, m[r], l[r], acc + r * head_dim);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = it.q_begin + r / group;
    const int64_t h = it.kv_head * group + r % group;
    float* o = out + ((q_start + t) * num_heads + h) * head_dim;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    const float* a = acc + r * head_dim;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) o[d] = a[d] * inv;
  }
}

// One KV head of a slice of decode sequences (one query token each), sorted by block table so
// that sequences sharing prefix blocks sit next to each other. Block index b is visited for the
// whole slice at once, and each run of sequences with the same block id at b reads that block
// from memory once and computes it for all of the run's rows together: in a multi-turn batch,
// where later turns extend earlier ones, that more than halves the K/V bytes read per step.
// Every row goes through the same arithmetic over the same blocks in the same order whatever
// its slice or its run, so a sequence's output is bit-identical whether or not others share its
// blocks (the prefix cache on or off). With a sliding window, sequence u visits only blocks
// first_block(u) .. num_blocks(u) - 1, the ones its window reaches.
void run_decode_slice(const int64_t* seqs, int64_t count, int64_t kv_head, const float* q, int64_t q_stride, float* out,
                      const float* k_cache, const float* v_cache, const int32_t* tables, int64_t max_blocks,
                      const int32_t* lens, const int32_t* starts, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_dim, int64_t block_size, const ScoreRule& rule, std::vector<float>& scratch) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t rows = count * group;
  scratch.assign(rows * head_dim + block_size + rows * 17 + 16, 0.f);
  float* acc = scratch.data();            // [rows, head_dim]; row u * group + g
  float* scores = acc + rows * head_dim;  // [block_size], one row at a time
  float* m = scores + block_size;
  // [rows, 16], 64-byte aligned (a row's 16 lanes one cache line): row r's running sum at l[16 r],
  // split over its 16 lanes on the tile path (tile16::decode_rows); the other path keeps it in
  // lane 0 and leaves the rest 0.
  float* l = m + rows + (16 - (reinterpret_cast<uintptr_t>(m + rows) / sizeof(float)) % 16) % 16;
  for (int64_t r = 0; r < rows; ++r) m[r] = -std::numeric_limits<float>::infinity();
  const int64_t block_floats = block_size * head_dim;
  auto num_blocks = [&](int64_t u) { return (lens[seqs[u]] + block_size - 1) / block_size; };
  auto lo = [&](int64_t u) { return rule.lo(lens[seqs[u]] - 1); };  // the query sits at len - 1
  auto first_block = [&](int64_t u) { return lo(u) / block_size; };
  auto visits = [&](int64_t u, int64_t b) { return first_block(u) <= b && b < num_blocks(u); };
  auto block_id = [&](int64_t u, int64_t b) { return static_cast<int64_t>(tables[seqs[u] * max_blocks + b]); };
  auto offset = [&](int64_t id) { return block_offset(id, kv_head, num_kv_heads, block_size, head_dim); };
  auto q_row = [&](int64_t r) {  // row r = (sequence u = r / group, q head g = r % group of the KV head)
    return q + static_cast<int64_t>(starts[seqs[r / group]]) * q_stride + (kv_head * group + r % group) * head_dim;
  };
  int64_t most_blocks = 0, fewest_skipped = std::numeric_limits<int64_t>::max();
  for (int64_t u = 0; u < count; ++u) {
    most_blocks = std::max(most_blocks, num_blocks(u));
    fewest_skipped = std::min(fewest_skipped, first_block(u));
  }
  // The slice's runs in visiting order: (block index b, sequences [i, j) in sorted order, which
  // all visit block id at b). Listed first, so that the loop below can prefetch ahead.
  struct Run {
    int64_t b, i, j, id;
  };
  std::vector<Run> runs;
  for (int64_t b = fewest_skipped; b < most_blocks; ++b) {
    int64_t i = 0;
    while (i < count) {
      if (!visits(i, b)) {
        ++i;
        continue;
      }
      const int64_t id = block_id(i, b);
      int64_t j = i + 1;
      while (j < count && visits(j, b) && block_id(j, b) == id) ++j;
      runs.push_back({b, i, j, id});
      i = j;
    }
  }
  const int64_t num_runs = static_cast<int64_t>(runs.size());
  for (int64_t k = 0; k < kL2Ahead && k < num_runs; ++k) {
    prefetch_block<2>(k_cache + offset(runs[k].id), v_cache + offset(runs[k].id), block_floats);
  }
  for (int64_t k = 0; k < num_runs; ++k) {
    const auto [b, i, j, id] = runs[k];
    const int64_t base = b * block_size;
    // Blocks sit anywhere in the pool, where no hardware prefetcher can guess them: the next
    // run's block is asked into L1, and the one kL2Ahead runs on into L2, so that several
    // blocks' lines are in flight while this one is computed (L1 alone holds too few misses).
    // On the tile path the next block's L1 requests go out a line at a time inside the first
    // chunk's score loop (decode_rows): issued all at once before it, they filled the miss
    // queue and stalled this block's own loads (a batch-64 decode step from memory 10-15%
    // slower, `jobs/bench/attention_kernel.py --cases decode multi_turn`).
    const float* next_kt = k + 1 < num_runs ? k_cache + offset(runs[k + 1].id) : nullptr;
    const float* next_vb = k + 1 < num_runs ? v_cache + offset(runs[k + 1].id) : nullptr;
    if (k + kL2Ahead < num_runs) {
      prefetch_block<2>(k_cache + offset(runs[k + kL2Ahead].id), v_cache + offset(runs[k + kL2Ahead].id),
                        block_floats);
    }
    const float* kt = k_cache + offset(id);
    const float* vb = v_cache + offset(id);
    // The keys of the block row r sees: first(r) .. visible(r) - 1 (its causal limit, and its
    // window's start where that falls inside the block).
    auto visible = [&](int64_t r) { return std::min(block_size, lens[seqs[r / group]] - base); };
    auto first = [&](int64_t r) { return std::max<int64_t>(0, lo(r / group) - base); };
#if defined(BATCHGEN_TILE16)
    if (block_size == 16 && head_dim % 16 == 0) {
      // The run's rows (i * group .. j * group - 1, adjacent in acc, m and l) in chunks of up to
      // kDecodeRows that see the same keys (a block can be the last, partial one of some
      // sequences of the run, or hold the start of some one's window).
      constexpr int64_t kChunk = tile16::kDecodeRows;
      const float* qs[kChunk];
      float* accs[kChunk];
      int64_t chunk = 0, chunk_n = 0, chunk_first = 0, r0 = 0;
      for (int64_t r = i * group; r <= j * group; ++r) {
        const bool end = r == j * group;
        if (chunk > 0 && (end || chunk == kChunk || visible(r) != chunk_n || first(r) != chunk_first)) {
          tile16::decode_rows_n(chunk, qs, kt, vb, chunk_first, chunk_n, head_dim, rule, m + r0, l + 16 * r0, accs,
                                next_kt, next_vb);
          next_kt = next_vb = nullptr;  // asked for once per run
          chunk = 0;
        }
        if (end) break;
        if (chunk == 0) chunk_n = visible(r), chunk_first = first(r), r0 = r;
        qs[chunk] = q_row(r);
        accs[chunk++] = acc + r * head_dim;
      }
      continue;
    }
#endif
    if (next_kt != nullptr) prefetch_block<3>(next_kt, next_vb, block_floats);
    for (int64_t r = i * group; r < j * group; ++r) {
      row_block(q_row(r), kt, vb, block_size, first(r), visible(r), head_dim, rule, scores, m[r], l[16 * r],
                acc + r * head_dim);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + (static_cast<int64_t>(starts[seqs[r / group]]) * num_heads + kv_head * group + r % group) * head_dim;
    const float sum = lane_sum(l + 16 * r);  // the other path's lanes 1 .. 15 are 0: adding them is exact
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const float* a = acc + r * head_dim;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) o[d] = a[d] * inv;
  }
}

// Cuts the decode sequences (sorted by block table; blocks[u] is the u-th one's block count,
// shared[u] the leading block ids it has in common with the (u - 1)-th, shared[0] = 0) into
// slices for run_decode_slice. A cut between neighbours that share no leading block costs
// nothing; slices costlier than `target` are cut again where their neighbours share the fewest
// leading blocks, so that the threads still get enough items to balance. Returns {begin, end,
// cost} of each slice, [begin, end) in the sorted order.
std::vector<std::array<int64_t, 3>> cut_decode_slices(const std::vector<int64_t>& shared,
                                                      const std::vector<int64_t>& blocks, int64_t block_size,
                                                      int64_t target) {
  // The cost of a slice in the item unit (query tokens x keys): a decode row's key reads are
  // about 3/5 of its time when they come from memory (measured: 56 ms hot against 140 ms cold
  // for a batch-64 step), so a key loaded once for a run of sequences counts 3/5 once and 2/5
  // for each sequence of the run.
  auto cost = [&](int64_t begin, int64_t end) {
    int64_t total = 0, loaded = 0;
    for (int64_t u = begin; u < end; ++u) {
      total += blocks[u];
      loaded += blocks[u] - (u > begin ? shared[u] : 0);
    }
    return (2 * total + 3 * loaded) * block_size / 5;
  };
  std::vector<std::pair<int64_t, int64_t>> slices;
  const int64_t n = static_cast<int64_t>(blocks.size());
  for (int64_t u = 0; u < n; ++u) {
    if (u == 0 || shared[u] == 0) slices.emplace_back(u, u + 1);
    else slices.back().second = u + 1;
  }
  for (;;) {
    int64_t worst = -1, worst_cost = target;
    for (int64_t k = 0; k < static_cast<int64_t>(slices.size()); ++k) {
      const auto [begin, end] = slices[k];
      const int64_t c = cost(begin, end);
      if (end - begin > 1 && c > worst_cost) worst = k, worst_cost = c;
    }
    if (worst < 0) break;
    const auto [begin, end] = slices[worst];
    int64_t at = begin + 1;
    for (int64_t u = begin + 1; u < end; ++u) {
      // fewest shared blocks; among equals the cut nearest the middle
      const bool fewer = shared[u] < shared[at];
      const bool nearer = shared[u] == shared[at] && std::abs(2 * u - begin - end) < std::abs(2 * at - begin - end);
      if (fewer || nearer) at = u;
    }
    slices[worst] = {begin, at};
    slices.insert(slices.begin() + worst + 1, {at, end});
  }
  std::vector<std::array<int64_t, 3>> out;
  for (const auto& [begin, end] : slices) out.push_back({begin, end, cost(begin, end)});
  return out;
}

// True when k_cache/v_cache ([num_blocks, block_size, KVH, D] by size) are views of the kernel's
// layout: K stored [num_blocks, KVH, D, block_size], V stored [num_blocks, KVH, block_size, D].
bool is_kernel_layout(const torch::Tensor& k_cache, const torch::Tensor& v_cache) {
  if (k_cache.dim() != 4 || k_cache.sizes() != v_cache.sizes()) return false;
  const int64_t bs = k_cache.size(1), kvh = k_cache.size(2), d = k_cache.size(3);
  return k_cache.stride(0) == kvh * d * bs && k_cache.stride(1) == 1 && k_cache.stride(2) == d * bs &&
         k_cache.stride(3) == bs && v_cache.stride(0) == kvh * bs * d && v_cache.stride(1) == d &&
         v_cache.stride(2) == bs * d && v_cache.stride(3) == 1;
}

// Whether each token's [num_heads, head_dim] of a 3-D query is one contiguous run, the tokens
// any stride (at least that run) apart; strides of dimensions of size 1 do not matter.
bool heads_contiguous(const torch::Tensor& query) {
  const int64_t t = query.size(0), h = query.size(1), d = query.size(2);
  return (d <= 1 || query.stride(2) == 1) && (h <= 1 || query.stride(1) == d) && (t <= 1 || query.stride(0) >= h * d);
}

}  // namespace

// query [T, H, D] (read in place where heads_contiguous, else copied); caches [num_blocks, block_size, KVH, D] as views of the kernel's
// layout (float32; see the top of this file): K stored [num_blocks, KVH, D, block_size], V stored
// [num_blocks, KVH, block_size, D]. block_tables int32 [S, max_blocks], seq_lens int32 [S],
// query_start_loc int32 [S + 1]. sliding_window (>= 1) and logits_soft_cap (> 0, finite): see
// the top of this file; None for neither.
torch::Tensor paged_attention(torch::Tensor query, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, torch::Tensor seq_lens,
                              torch::Tensor query_start_loc, double scale, c10::optional<int64_t> sliding_window,
                              c10::optional<double> logits_soft_cap) {
  TORCH_CHECK(!sliding_window.has_value() || *sliding_window >= 1,
              "cpu paged attention: sliding_window must be at least 1, got ", sliding_window.value_or(0));
  TORCH_CHECK(!logits_soft_cap.has_value() || (*logits_soft_cap > 0.0 && std::isfinite(*logits_soft_cap)),
              "cpu paged attention: logits_soft_cap must be positive and finite, got ", logits_soft_cap.value_or(0.0));
  ScoreRule rule{};
  rule.scale = static_cast<float>(scale);
  rule.has_cap = logits_soft_cap.has_value();
  rule.cap = static_cast<float>(logits_soft_cap.value_or(1.0));
  rule.inv_cap = 1.0f / rule.cap;
  rule.has_window = sliding_window.has_value();
  rule.window = sliding_window.value_or(0);
  TORCH_CHECK(query.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32 &&
                  v_cache.scalar_type() == torch::kFloat32,
              "cpu paged attention takes float32");
  // The query is read in place where each token's heads are one run, the tokens any stride apart
  // (a view into the fused q/k/v projection's output: copying it cost a prefill step 0.2-0.5 ms
  // a layer), and copied otherwise.
  if (query.dim() == 3 && !heads_contiguous(query)) query = query.contiguous();
  TORCH_CHECK(block_tables.is_contiguous(),
              "cpu paged attention takes a contiguous block table");
  TORCH_CHECK(is_kernel_layout(k_cache, v_cache),
              "cpu paged attention reads K/V pools in its own layout (K transposed per block and head, V "
              "head-major): allocate them with batchgen.kernels.new_kv_cache");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32 &&
                  query_start_loc.scalar_type() == torch::kInt32,
              "metadata must be int32");
  TORCH_CHECK(query.dim() == 3 && query.size(2) == k_cache.size(3),
              "cpu paged attention: query must be [num_tokens, num_heads, head_dim] with the pools' head_dim ",
              k_cache.size(3), ", got ", query.sizes());
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.is_contiguous() && query_start_loc.is_contiguous() &&
                  query_start_loc.dim() == 1 && query_start_loc.size(0) == seq_lens.size(0) + 1 &&
                  block_tables.dim() == 2 && block_tables.size(0) == seq_lens.size(0),
              "cpu paged attention: for S sequences, seq_lens must be [S], query_start_loc [S + 1] and "
              "block_tables [S, max_blocks], got ", seq_lens.sizes(), ", ", query_start_loc.sizes(), " and ",
              block_tables.sizes());
  const int64_t num_seqs = seq_lens.size(0);
  const int64_t max_blocks = block_tables.size(1);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  // The metadata is built by the engine, but a wrong value here would read outside the pools or
  // write outside the output: each sequence's values are checked where the loop below reads them
  // anyway (predictable branches; about 1 us for a batch-64 decode step's tables).
  const int64_t num_pool_blocks = k_cache.size(0);
  TORCH_CHECK(starts[0] >= 0 && starts[num_seqs] <= query.size(0),
              "cpu paged attention: query_start_loc spans tokens ", starts[0], " to ", starts[num_seqs],
              ", outside the query's ", query.size(0), " tokens");
  std::vector<Item> items;
  items.reserve(num_seqs * num_kv_heads);
#if defined(BATCHGEN_TILE16)
  const int64_t tile_q = block_size == 16 && head_dim % 16 == 0 ? kTileQWide : kTileQ;
#else
  const int64_t tile_q = kTileQ;
#endif
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t group = num_heads / num_kv_heads;
  std::vector<int64_t> decode;  // sequences with one query token, run as slices
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = starts[s + 1] - starts[s];
    const int64_t context = lens[s] - q_len;
    TORCH_CHECK(q_len >= 0, "cpu paged attention: query_start_loc decreases at sequence ", s, " (", starts[s],
                " then ", starts[s + 1], ")");
    TORCH_CHECK(context >= 0, "cpu paged attention: sequence ", s, " has ", q_len,
                " query tokens but a seq_len of ", lens[s]);
    const int64_t seq_blocks = (lens[s] + block_size - 1) / block_size;
    TORCH_CHECK(seq_blocks <= max_blocks, "cpu paged attention: sequence ", s, " has seq_len ", lens[s],
                ", more than its block table's ", max_blocks, " blocks of ", block_size, " hold");
    const int32_t* table = tables + s * max_blocks;
    bool ids_in_pool = true;
    for (int64_t b = 0; b < seq_blocks; ++b) {
      ids_in_pool &= static_cast<uint64_t>(static_cast<int64_t>(table[b])) < static_cast<uint64_t>(num_pool_blocks);
    }
    if (C10_UNLIKELY(!ids_in_pool)) {
      const int64_t b = std::find_if(table, table + seq_blocks,
                                     [&](int32_t id) { return id < 0 || id >= num_pool_blocks; }) - table;
      TORCH_CHECK(false, "cpu paged attention: sequence ", s, " reads block id ", table[b], " (block index ", b,
                  "), outside the pool's ", num_pool_blocks, " blocks");
    }
    if (q_len == 1) {
      decode.push_back(s);
      continue;
    }
    for (int64_t t0 = 0; t0 < q_len; t0 += tile_q) {
      const int64_t t1 = std::min(q_len, t0 + tile_q);
      const int64_t keys = context + t1 - rule.lo(context + t0);  // the tile's key range
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({s, h, t0, t1, (t1 - t0) * keys});
    }
  }
  const int64_t num_threads = std::max<int64_t>(1, at::get_num_threads());
  if (!decode.empty()) {
    auto row = [&](int64_t s) { return tables + s * max_blocks; };
    auto blocks_of = [&](int64_t s) { return (static_cast<int64_t>(lens[s]) + block_size - 1) / block_size; };
    std::stable_sort(decode.begin(), decode.end(), [&](int64_t a, int64_t b) {
      return std::lexicographical_compare(row(a), row(a) + blocks_of(a), row(b), row(b) + blocks_of(b));
    });
    // With a sliding window a sequence visits blocks skipped_of(s) .. blocks_of(s) - 1 only:
    // blocks[u] counts those, shared[u] those it shares with its neighbour u - 1 (leading ids
    // equal, and visited by both).
    auto skipped_of = [&](int64_t s) { return rule.lo(lens[s] - 1) / block_size; };
    const int64_t n = static_cast<int64_t>(decode.size());
    std::vector<int64_t> shared(n, 0), blocks(n);
    int64_t keys = 0;
    for (int64_t u = 0; u < n; ++u) {
      blocks[u] = blocks_of(decode[u]) - skipped_of(decode[u]);
      keys += lens[decode[u]] - rule.lo(lens[decode[u]] - 1);
      if (u > 0) {
        const int64_t limit = std::min(blocks_of(decode[u]), blocks_of(decode[u - 1]));
        const int32_t* a = row(decode[u - 1]);
        const int32_t* b = row(decode[u]);
        int64_t prefix = 0;
        while (prefix < limit && a[prefix] == b[prefix]) ++prefix;
        shared[u] = std::max<int64_t>(0, prefix - std::max(skipped_of(decode[u]), skipped_of(decode[u - 1])));
      }
    }
    const int64_t target = std::max<int64_t>(1, keys / (4 * num_threads));
    for (const auto& [begin, end, cost] : cut_decode_slices(shared, blocks, block_size, target)) {
      for (int64_t h = 0; h < num_kv_heads; ++h) items.push_back({-1, h, begin, end, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  auto out = torch::empty(query.sizes(), query.options());  // contiguous, whatever the query's strides
  const float* q = query.data_ptr<float>();
  const int64_t q_stride = query.size(0) > 1 ? query.stride(0) : num_heads * head_dim;
  float* o = out.data_ptr<float>();
  const float* kc = k_cache.data_ptr<float>();
  const float* vc = v_cache.data_ptr<float>();
  std::atomic<int64_t> next{0};
  const int64_t num_items = static_cast<int64_t>(items.size());
  const int64_t num_workers = std::max<int64_t>(1, std::min<int64_t>(num_threads, num_items));
  at::parallel_for(0, num_workers, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t i = next.fetch_add(1); i < num_items; i = next.fetch_add(1)) {
        const Item& it = items[i];
        if (it.seq < 0) {
          run_decode_slice(decode.data() + it.q_begin, it.q_end - it.q_begin, it.kv_head, q, q_stride, o, kc, vc, tables,
                           max_blocks, lens, starts, num_heads, num_kv_heads, head_dim, block_size, rule,
                           scratch);
          continue;
        }
        const int64_t s = it.seq;
        run_item(it, q, q_stride, o, kc, vc, tables + s * max_blocks, lens[s], starts[s + 1] - starts[s], starts[s],
                 num_heads, num_kv_heads, head_dim, block_size, rule, scratch);
      }
    }
  });
  return out;
}

// RMSNorm, the rotary embedding, SiLU-and-multiply (they use exp_neg above), the KV write,
// argmax and the grammar bitmask.
#include "cpu_small_ops.h"

#if defined(BATCHGEN_TILE16)
// The bfloat16 linear kernels where the CPU has AVX512-BF16's dot products (not in the AVX2 halves
// or the emulation builds).
#if defined(__AVX512BF16__) && !defined(BATCHGEN_TILE16_HALVES) && !defined(BATCHGEN_EMULATE_AVX512)
#define BATCHGEN_BF16_DOT 1
#endif
// Linear layers over column-packed weights (on the tile path's CPUs: AVX-512, or AVX2 halves).
#include "cpu_linear.h"
// Greedy tokens from bfloat16 estimates of the LM head's logits and a few float32 ones.
#include "cpu_greedy.h"
// ... or from int8 estimates, where the CPU has AVX512-VNNI (not in the AVX2 halves or the
// emulation builds).
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(BATCHGEN_TILE16_HALVES) && \
    !defined(BATCHGEN_EMULATE_AVX512)
#define BATCHGEN_INT8_DOT 1
#include "cpu_greedy_int8.h"
#endif
#endif

// What kernels/linear_cpu.py packs for: the linear kernel's panel width and the gated kernel's
// gate columns per panel (then as many up columns); (0, 0) where this build has neither (a CPU
// without AVX2).
std::pair<int64_t, int64_t> linear_panel_widths() {
#if defined(BATCHGEN_TILE16)
  return {tile16::kPanel, tile16::kGatedHalf};
#else
  return {0, 0};
#endif
}

// Every function runs without the GIL (its arguments are converted before, its result after):
// none touches a Python object, and a decode step's two streams (batchgen/engine/cpu_streams.py)
// run the kernels on two threads at once.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto kNoGil = py::call_guard<py::gil_scoped_release>();
  m.def("paged_attention", &paged_attention, "paged attention over the KV block pool (float32, CPU)",
        py::arg("query"), py::arg("k_cache"), py::arg("v_cache"), py::arg("block_tables"), py::arg("seq_lens"),
        py::arg("query_start_loc"), py::arg("scale"), py::arg("sliding_window") = py::none(),
        py::arg("logits_soft_cap") = py::none(), kNoGil);
  m.def("rms_norm", &rms_norm, "RMSNorm with the residual add (float32, CPU)", kNoGil);
  m.def("rotary_embedding", &rotary_embedding, "rotary embedding in place (float32, CPU)", kNoGil);
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up of a fused [gate | up] (float32, CPU)", kNoGil);
  m.def("write_kv", &write_kv, "store each token's K/V at its pool slot (float32, CPU)", kNoGil);
  m.def("argmax_rows", &argmax_rows, "index of each row's largest value, as torch.argmax (float32, CPU)", kNoGil);
  m.def("linear_panel_widths", &linear_panel_widths,
        "the packed linear kernel's panel width and the gated kernel's gate columns per panel ((0, 0): none here)", kNoGil);
#if defined(BATCHGEN_TILE16)
  m.def("packed_silu_gate_up", &packed_silu_gate_up, "silu(x G^T) * (x U^T) over a gate/up-packed weight (float32, CPU)",
        py::arg("x"), py::arg("packed"), py::arg("intermediate"), kNoGil);
  m.def("packed_linear", &packed_linear, "x W^T + b over a column-packed weight (float32, CPU)", py::arg("x"),
        py::arg("packed"), py::arg("out_features"), py::arg("bias") = py::none(), kNoGil);
#if defined(BATCHGEN_BF16_DOT)
  m.def("packed_linear_bf16", &packed_linear_bf16,
        "x W^T + b with bfloat16 products summed in float32, over a bfloat16-pair panel weight (CPU)", py::arg("x"),
        py::arg("packed"), py::arg("out_features"), py::arg("bias") = py::none(), kNoGil);
  m.def("packed_silu_gate_up_bf16", &packed_silu_gate_up_bf16,
        "silu(x G^T) * (x U^T) with bfloat16 products summed in float32 (CPU)", py::arg("x"), py::arg("packed"),
        py::arg("intermediate"), kNoGil);
#endif
#if defined(BATCHGEN_INT8_DOT)
  m.def("greedy_estimate_int8", &greedy_estimate_int8,
        "the LM head's logits from int8 x and weights (AVX512-VNNI), with each row's bound terms", py::arg("x"),
        py::arg("w8"), py::arg("scales"), kNoGil);
  m.def("greedy_screen_int8", &greedy_screen_int8,
        "each row's greedy token from int8 logit estimates and float32 logits of the candidates (-1: undecided)",
        py::arg("estimates"), py::arg("a"), py::arg("xn"), py::arg("x"), py::arg("packed"), py::arg("bsum"),
        py::arg("bnorm"), py::arg("q"), py::arg("max_candidates"), py::arg("rows") = py::none(), kNoGil);
#endif
  m.def("greedy_screen", &greedy_screen,
        "each row's greedy token from logit estimates (bfloat16 operands, float32) and float32 logits of the candidates (-1: undecided)",
        py::arg("estimates"), py::arg("x"), py::arg("packed"), py::arg("norms"), py::arg("coef"),
        py::arg("max_candidates"), py::arg("rows") = py::none(), kNoGil);
#endif
  m.def("apply_token_bitmask", &apply_token_bitmask, "grammar bitmasks applied to logits rows in place (float32, CPU)", kNoGil);
}
