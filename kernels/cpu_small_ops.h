// The per-layer small ops of the CPU path (float32), included by cpu_attention.cpp after its
// exp_neg. Each is several PyTorch ops per layer otherwise: at decode batch sizes their dispatch,
// at prefill sizes their extra passes over memory, is what costs.
#pragma once

// RMSNorm with the residual add folded in: h = x + residual (x when there is none), out = weight *
// (h * (1 / sqrt(mean(h^2) + eps))). x, residual [T, N] contiguous; returns (out, h).
std::vector<torch::Tensor> rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual,
                                    torch::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32,
              "cpu rms_norm takes float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && weight.is_contiguous(), "cpu rms_norm takes contiguous [T, N]");
  const bool has_residual = residual.has_value();
  if (has_residual) {
    TORCH_CHECK(residual->scalar_type() == torch::kFloat32 && residual->is_contiguous() &&
                    residual->sizes() == x.sizes(),
                "residual must be float32, contiguous, shaped like x");
  }
  const int64_t rows = x.size(0), n = x.size(1);
  auto h = has_residual ? torch::empty_like(x) : x;
  auto out = torch::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* rp = has_residual ? residual->data_ptr<float>() : nullptr;
  const float* w = weight.data_ptr<float>();
  float* hp = h.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float feps = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* src = xp + r * n;
      if (has_residual) {
        float* hr = hp + r * n;
        const float* rr = rp + r * n;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) hr[j] = src[j] + rr[j];
        src = hr;
      }
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < n; ++j) sum += src[j] * src[j];
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + feps);
      float* o = op + r * n;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = w[j] * (src[j] * inv);
    }
  });
  return {out, h};
}

// Rotary embedding in place ("rotate_half" form): for each head x of query [T, H, D] and key
// [T, KVH, D] (views with a unit last stride; rows may be strided, as in a fused qkv),
// x1, x2 = halves; x <- (x1 cos - x2 sin, x2 cos + x1 sin) with cos/sin [P, D/2] at the token's
// position. Separate multiplies and subtractions (the build disables FMA contraction), so the
// result is bit-identical to the PyTorch path.
void rotary_embedding(torch::Tensor positions, torch::Tensor query, torch::Tensor key, torch::Tensor cos,
                      torch::Tensor sin) {
  TORCH_CHECK(query.scalar_type() == torch::kFloat32 && key.scalar_type() == torch::kFloat32 &&
                  cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32,
              "cpu rotary_embedding takes float32");
  TORCH_CHECK(query.stride(2) == 1 && key.stride(2) == 1 && cos.is_contiguous() && sin.is_contiguous(),
              "cpu rotary_embedding needs a unit last stride and contiguous cos/sin");
  auto pos = positions.to(torch::kInt64).contiguous();
  const int64_t* pp = pos.data_ptr<int64_t>();
  const int64_t tokens = query.size(0), half = query.size(2) / 2;
  TORCH_CHECK(cos.size(1) == half, "cos/sin must be [max_positions, head_dim / 2]");
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  struct View {
    float* base;
    int64_t heads, token_stride, head_stride;
  };
  const View views[2] = {{query.data_ptr<float>(), query.size(1), query.stride(0), query.stride(1)},
                         {key.data_ptr<float>(), key.size(1), key.stride(0), key.stride(1)}};
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + pp[t] * half;
      const float* s = sp + pp[t] * half;
      for (const View& v : views) {
        for (int64_t hd = 0; hd < v.heads; ++hd) {
          float* x = v.base + t * v.token_stride + hd * v.head_stride;
#pragma omp simd
          for (int64_t i = 0; i < half; ++i) {
            const float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * c[i] - x2 * s[i];
            x[i + half] = x2 * c[i] + x1 * s[i];
          }
        }
      }
    }
  });
}

// out[t, j] = silu(g) * u with g = x[t, j], u = x[t, n + j]: the MLP activation of a fused
// [gate | up] projection x [T, 2n] (contiguous), in one pass instead of PyTorch's silu and
// multiply over strided halves. silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|) (<= 1, so
// exp_neg serves): 1 / (1 + e) for g >= 0, e / (1 + e) below; relative error about 3e-7.
torch::Tensor silu_and_mul(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "cpu silu_and_mul takes float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) % 2 == 0,
              "cpu silu_and_mul takes a contiguous [T, 2n]");
  const int64_t rows = x.size(0), n = x.size(1) / 2;
  auto out = torch::empty({rows, n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = xp + r * 2 * n;
      const float* u = g + n;
      float* o = op + r * n;
      int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
      const __m256 one = _mm256_set1_ps(1.0f);
      const __m256 sign = _mm256_set1_ps(-0.0f);
      for (; j + 8 <= n; j += 8) {
        const __m256 gv = _mm256_loadu_ps(g + j);
        const __m256 e = exp_neg(_mm256_or_ps(gv, sign));  // exp(-|g|)
        const __m256 inv = _mm256_div_ps(one, _mm256_add_ps(one, e));
        const __m256 is_neg = _mm256_cmp_ps(gv, _mm256_setzero_ps(), _CMP_LT_OQ);
        const __m256 sig = _mm256_blendv_ps(inv, _mm256_mul_ps(e, inv), is_neg);
        _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + j)));
      }
#endif
      for (; j < n; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
    }
  });
  return out;
}

// Index of each row's largest value, as torch.argmax(x, dim=-1): the first one on ties, the first
// NaN where a row has one. x [T, V] contiguous; returns int64 [T]. torch's CPU argmax keeps an
// index beside every comparison and runs at about 4 GB/s (3 ms for a decode step's [64, 49152]
// logits); this takes the row's maximum with vector max, then finds its first position.
torch::Tensor argmax_rows(torch::Tensor x) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "cpu argmax takes float32");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) > 0, "cpu argmax takes a contiguous, non-empty [T, V]");
  const int64_t rows = x.size(0), n = x.size(1);
  auto out = torch::empty({rows}, x.options().dtype(torch::kInt64));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* p = xp + r * n;
      int64_t j = 0;
      float best = -std::numeric_limits<float>::infinity();
      bool has_nan = false;
#if defined(__AVX512F__)
      __m512 vbest = _mm512_set1_ps(best);
      __mmask16 nan_lanes = 0;
      for (; j + 16 <= n; j += 16) {
        const __m512 v = _mm512_loadu_ps(p + j);
        nan_lanes |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        vbest = _mm512_max_ps(vbest, v);
      }
      best = _mm512_reduce_max_ps(vbest);
      has_nan = nan_lanes != 0;
#endif
      for (; j < n; ++j) {
        has_nan = has_nan || std::isnan(p[j]);
        best = std::max(best, p[j]);
      }
      int64_t at = 0;
      if (has_nan) {
        while (!std::isnan(p[at])) ++at;
      } else {
        while (p[at] != best) ++at;  // best is one of the row's values
      }
      op[r] = at;
    }
  });
  return out;
}

// Grammar masks applied in place: row rows[i] of x keeps the tokens that bitmask[i] allows and
// every other logit becomes -inf. bitmask is int32 [k, words] in llguidance's layout (bit j of
// word w allows token 32 w + j); tokens at or past 32 * words are banned. Returns bool [k]: true
// where row rows[i] has no logit left above -inf (a NaN counts as one left, as amax sees it).
// Reading the packed words directly replaces unpacking them to a [k, V] bool tensor and a
// masked_fill over it (about 30 ms for a step's [64, 49152] on one core; this is one pass).
torch::Tensor apply_token_bitmask(torch::Tensor x, torch::Tensor rows, torch::Tensor bitmask) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.dim() == 2 && x.is_contiguous(),
              "cpu apply_token_bitmask takes a contiguous float32 [T, V]");
  TORCH_CHECK(rows.scalar_type() == torch::kInt64 && rows.dim() == 1 && rows.is_contiguous(),
              "rows must be contiguous int64 [k]");
  TORCH_CHECK(bitmask.scalar_type() == torch::kInt32 && bitmask.dim() == 2 && bitmask.is_contiguous() &&
                  bitmask.size(0) == rows.size(0),
              "bitmask must be contiguous int32 [k, words], one row per entry of rows");
  const int64_t k = rows.size(0), num_rows = x.size(0), n = x.size(1), words = bitmask.size(1);
  const int64_t* rp = rows.data_ptr<int64_t>();
  std::vector<char> seen(num_rows, 0);
  for (int64_t i = 0; i < k; ++i) {
    TORCH_CHECK(rp[i] >= 0 && rp[i] < num_rows, "row ", rp[i], " is outside x's ", num_rows, " rows");
    TORCH_CHECK(!seen[rp[i]], "row ", rp[i], " is listed twice");
    seen[rp[i]] = 1;
  }
  auto empty = torch::empty({k}, x.options().dtype(torch::kBool));
  float* xp = x.data_ptr<float>();
  const uint32_t* bp = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
  bool* ep = empty.data_ptr<bool>();
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t covered = std::min(n, 32 * words);
  at::parallel_for(0, k, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* p = xp + rp[i] * n;
      const uint32_t* w = bp + i * words;
      bool left = false;
      int64_t j = 0;
#if defined(__AVX512F__)
      const __m512 vninf = _mm512_set1_ps(ninf);
      for (; j + 32 <= covered; j += 32) {
        const uint32_t bits = w[j >> 5];
        for (int half = 0; half < 2; ++half) {
          const __mmask16 keep = static_cast<__mmask16>(bits >> (16 * half));
          float* q = p + j + 16 * half;
          if (keep != 0) {
            const __m512 v = _mm512_maskz_loadu_ps(keep, q);
            left = left || (_mm512_mask_cmp_ps_mask(keep, v, vninf, _CMP_NEQ_UQ) != 0);
          }
          if (keep != 0xFFFF) _mm512_mask_storeu_ps(q, static_cast<__mmask16>(~keep), vninf);
        }
      }
#endif
      for (; j < covered; ++j) {
        if ((w[j >> 5] >> (j & 31)) & 1u) {
          left = left || !(p[j] == ninf);
        } else {
          p[j] = ninf;
        }
      }
      for (; j < n; ++j) p[j] = ninf;
      ep[i] = !left;
    }
  });
  return empty;
}

// k_cache/v_cache [num_blocks, block_size, KVH, D] (contiguous): the row at slot s (block s /
// block_size, offset s % block_size) <- key/value [T, KVH, D] token t, s = slot_mapping[t]
// (int64); slot -1 (a padding token) is skipped, as the Triton path does. key/value may be
// views into a fused qkv (unit last stride, rows strided). One call instead of two index_copy_,
// whose setup costs about 40 us each: 2.3 ms of a 30-layer decode step.
void write_kv(torch::Tensor key, torch::Tensor value, torch::Tensor k_cache, torch::Tensor v_cache,
              torch::Tensor slot_mapping) {
  TORCH_CHECK(key.scalar_type() == torch::kFloat32 && value.scalar_type() == torch::kFloat32 &&
                  k_cache.scalar_type() == torch::kFloat32 && v_cache.scalar_type() == torch::kFloat32,
              "cpu write_kv takes float32");
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous(),
              "slot_mapping must be contiguous int64");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(), "the caches must be of one shape");
  TORCH_CHECK(key.dim() == 3 && key.sizes() == value.sizes() && key.stride(2) == 1 && value.stride(2) == 1 &&
                  key.stride(1) == key.size(2) && value.stride(1) == value.size(2),
              "key/value must be [T, KVH, D] with contiguous heads");
  const int64_t tokens = key.size(0), row = key.size(1) * key.size(2);
  TORCH_CHECK(k_cache.size(2) * k_cache.size(3) == row, "key/value heads do not match the caches");
  TORCH_CHECK(slot_mapping.size(0) == tokens, "one slot per token");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] >= -1 && slots[t] < num_slots, "slot ", slots[t], " is outside the pool of ", num_slots);
  }
  const float* kp = key.data_ptr<float>();
  const float* vp = value.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  const int64_t block_size = k_cache.size(1), heads = k_cache.size(2), head_dim = k_cache.size(3);
  // Any strides: the compiled attention's pools are strided views (K transposed per block and
  // head, V head-major); a contiguous pool (the PyTorch path's layout) works too.
  auto store = [&](const float* src, int64_t src_stride, float* cache, const torch::Tensor& c) {
    const int64_t s0 = c.stride(0), s1 = c.stride(1), s2 = c.stride(2), s3 = c.stride(3);
    // Both threads: a token's K, stored transposed, touches head_dim cache lines per head, each
    // a miss into a cold block (measured: 140 us a layer at decode batch 64 on one thread).
    // Every token has its own slot, so the tokens split freely.
    at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        if (slots[t] < 0) continue;
        float* slot = cache + (slots[t] / block_size) * s0 + (slots[t] % block_size) * s1;
        const float* x = src + t * src_stride;
        for (int64_t h = 0; h < heads; ++h) {
          for (int64_t d = 0; d < head_dim; ++d) slot[h * s2 + d * s3] = x[h * head_dim + d];
        }
      }
    });
  };
  store(kp, key.stride(0), kc, k_cache);
  store(vp, value.stride(0), vc, v_cache);
}
