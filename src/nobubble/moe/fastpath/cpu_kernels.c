/* Fused CPU kernels for the shared-memory MoE fast path (compiled at first use by
 * nobubble/moe/cpu_kernels.py; plain C99, no Python or torch headers).
 *
 * combine_reduce_*: the source rank's side of combine. Source r (in rank order) sent back
 * rows[r] [counts[r], H], one per token, in ascending token order idx[r]. For every token n:
 *
 *     out[n] = round(((0 + rows[r0][.]) + rows[r1][.]) + ...)   over the sources r0 < r1 < ...
 *                                                               that hold a row for n
 *
 * summed in float32 in source-rank order - the same additions, in the same order, as
 * Buffer.combine_rows (zeros + index_add_ per source, then .to(dtype)), so the results are
 * bit-identical (NaN stays NaN; torch itself writes its bits two ways). One pass: each row is read once, each output row written once, the float32
 * accumulator stays in L1. Returns 0, or -1 - r if source r's tokens were not ascending and
 * distinct (nothing useful is in out then).
 */
#include <stdint.h>
#include <string.h>

#define MAX_SOURCES 1024

static inline float bf16_to_f32(uint16_t v) {
  uint32_t u = (uint32_t)v << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Round to nearest even, as torch's CPU conversion; every NaN becomes 0xffff, as there. */
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffff;
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int64_t combine_reduce_bf16(int64_t num_sources, const uint16_t *const *rows,
                            const int64_t *const *idx, const int64_t *counts, int64_t num_tokens,
                            int64_t hidden, uint16_t *out, float *acc) {
  int64_t cur[MAX_SOURCES];
  if (num_sources > MAX_SOURCES) return -1 - MAX_SOURCES;
  for (int64_t r = 0; r < num_sources; r++) cur[r] = 0;
  for (int64_t n = 0; n < num_tokens; n++) {
    for (int64_t h = 0; h < hidden; h++) acc[h] = 0.0f;
    for (int64_t r = 0; r < num_sources; r++) {
      if (cur[r] < counts[r] && idx[r][cur[r]] == n) {
        const uint16_t *row = rows[r] + cur[r] * hidden;
        for (int64_t h = 0; h < hidden; h++) acc[h] += bf16_to_f32(row[h]);
        cur[r]++;
      }
    }
    uint16_t *o = out + n * hidden;
    for (int64_t h = 0; h < hidden; h++) o[h] = f32_to_bf16(acc[h]);
  }
  for (int64_t r = 0; r < num_sources; r++)
    if (cur[r] != counts[r]) return -1 - r;
  return 0;
}

int64_t combine_reduce_f32(int64_t num_sources, const float *const *rows,
                           const int64_t *const *idx, const int64_t *counts, int64_t num_tokens,
                           int64_t hidden, float *out) {
  int64_t cur[MAX_SOURCES];
  if (num_sources > MAX_SOURCES) return -1 - MAX_SOURCES;
  for (int64_t r = 0; r < num_sources; r++) cur[r] = 0;
  for (int64_t n = 0; n < num_tokens; n++) {
    float *o = out + n * hidden;
    for (int64_t h = 0; h < hidden; h++) o[h] = 0.0f;
    for (int64_t r = 0; r < num_sources; r++) {
      if (cur[r] < counts[r] && idx[r][cur[r]] == n) {
        const float *row = rows[r] + cur[r] * hidden;
        for (int64_t h = 0; h < hidden; h++) o[h] += row[h];
        cur[r]++;
      }
    }
  }
  for (int64_t r = 0; r < num_sources; r++)
    if (cur[r] != counts[r]) return -1 - r;
  return 0;
}

/* weighted_combine_*: low-latency combine's reduction. row_addr [N, K] holds the address of
 * the expert output row for slot k of token n (0: the slot routed nowhere) - rows may live
 * anywhere, e.g. straight in the shared-memory slots they arrived in. For every token:
 *
 *     out[n] = round(((0 + w[n,0] * row(n,0)) + w[n,1] * row(n,1)) + ...)
 *
 * float32 products and sums, slots in ascending k - the same operations, in the same order, as
 * the torch path (zeros, then index_add_ of weights * rows.float() per slot). The build turns
 * off fused multiply-add contraction so each product is rounded before it is added.
 */
int64_t weighted_combine_bf16(int64_t num_tokens, int64_t topk, int64_t hidden,
                              const int64_t *row_addr, const float *weights, uint16_t *out,
                              float *acc) {
  for (int64_t n = 0; n < num_tokens; n++) {
    for (int64_t h = 0; h < hidden; h++) acc[h] = 0.0f;
    for (int64_t k = 0; k < topk; k++) {
      const uint16_t *row = (const uint16_t *)(uintptr_t)row_addr[n * topk + k];
      if (row == 0) continue;
      const float w = weights[n * topk + k];
      for (int64_t h = 0; h < hidden; h++) acc[h] += w * bf16_to_f32(row[h]);
    }
    uint16_t *o = out + n * hidden;
    for (int64_t h = 0; h < hidden; h++) o[h] = f32_to_bf16(acc[h]);
  }
  return 0;
}

int64_t weighted_combine_f32(int64_t num_tokens, int64_t topk, int64_t hidden,
                             const int64_t *row_addr, const float *weights, float *out) {
  for (int64_t n = 0; n < num_tokens; n++) {
    float *o = out + n * hidden;
    for (int64_t h = 0; h < hidden; h++) o[h] = 0.0f;
    for (int64_t k = 0; k < topk; k++) {
      const float *row = (const float *)(uintptr_t)row_addr[n * topk + k];
      if (row == 0) continue;
      const float w = weights[n * topk + k];
      for (int64_t h = 0; h < hidden; h++) o[h] += w * row[h];
    }
  }
  return 0;
}

/* fp8_quantize_* / fp8_dequantize_*: FP8 dispatch's casts, one pass each instead of torch's
 * ten. A row of H channels becomes H e4m3 bytes, then 4 bytes of float32 scale per block of
 * 128 channels (the last block may be shorter): amax = max(|x|, 1e-4f) over the block,
 * value = e4m3(x * ((1 / amax) * 448)), scale = amax / 448 - the same float32 operations as
 * nobubble.moe.fastpath.fp8.per_token_cast_to_fp8 and pack_fp8. Dequantising multiplies the decoded
 * value (table: torch's own decoding of all 256 bytes) by its block's scale and rounds to the
 * output dtype. A NaN in a block makes its amax, scale and every value NaN, as in torch.
 */
#define FP8_BLOCK 128

/* float -> e4m3fn with round to nearest even, as c10::Float8_e4m3fn (>= 480 becomes NaN). */
static inline uint8_t f32_to_e4m3fn(float f) {
  const uint32_t fp8_max = UINT32_C(1087) << 20;   /* 480.0f */
  const uint32_t denorm_mask = UINT32_C(141) << 23; /* 2^14 */
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  const uint32_t sign = bits & UINT32_C(0x80000000);
  bits ^= sign;
  uint8_t result;
  if (bits >= fp8_max) {
    result = 0x7f;
  } else if (bits < (UINT32_C(121) << 23)) { /* below 2^-6: subnormal in e4m3 */
    float g, m;
    memcpy(&g, &bits, sizeof g);
    memcpy(&m, &denorm_mask, sizeof m);
    g = g + m;
    memcpy(&bits, &g, sizeof bits);
    result = (uint8_t)(bits - denorm_mask);
  } else {
    const uint32_t mant_odd = (bits >> 20) & 1u;
    bits += ((uint32_t)(7 - 127) << 23) + UINT32_C(0x7ffff);
    bits += mant_odd;
    result = (uint8_t)(bits >> 20);
  }
  return result | (uint8_t)(sign >> 24);
}

static inline float f32_load(const void *p, int64_t bf16) {
  if (bf16) return bf16_to_f32(*(const uint16_t *)p);
  float f;
  memcpy(&f, p, sizeof f);
  return f;
}

int64_t fp8_quantize(int64_t num_tokens, int64_t hidden, const void *x, int64_t x_bf16,
                     uint8_t *packed, int64_t row_bytes) {
  const int64_t elt = x_bf16 ? 2 : 4;
  const float min_amax = 1e-4f;
  for (int64_t n = 0; n < num_tokens; n++) {
    const char *row = (const char *)x + n * hidden * elt;
    uint8_t *dst = packed + n * row_bytes;
    for (int64_t b0 = 0, blk = 0; b0 < hidden; b0 += FP8_BLOCK, blk++) {
      const int64_t b1 = b0 + FP8_BLOCK < hidden ? b0 + FP8_BLOCK : hidden;
      float amax = 0.0f;
      for (int64_t c = b0; c < b1; c++) {
        uint32_t u;
        const float v = f32_load(row + c * elt, x_bf16);
        memcpy(&u, &v, sizeof u);
        u &= 0x7fffffffu; /* |v|, as torch's abs */
        if (u > 0x7f800000u) { /* a NaN makes the block's amax NaN, as torch's amax */
          u = 0x7fc00000u;
          memcpy(&amax, &u, sizeof amax);
          break;
        }
        float a;
        memcpy(&a, &u, sizeof a);
        amax = a > amax ? a : amax;
      }
      amax = amax < min_amax ? min_amax : amax;
      const float inv = (1.0f / amax) * 448.0f; /* torch's 448 / t is t.reciprocal() * 448 */
      for (int64_t c = b0; c < b1; c++) dst[c] = f32_to_e4m3fn(f32_load(row + c * elt, x_bf16) * inv);
      const float scale = amax / 448.0f;
      memcpy(dst + hidden + 4 * blk, &scale, sizeof scale);
    }
  }
  return 0;
}

int64_t fp8_dequantize(int64_t num_tokens, int64_t hidden, const uint8_t *packed,
                       int64_t row_bytes, const float *table, void *out, int64_t out_bf16) {
  for (int64_t n = 0; n < num_tokens; n++) {
    const uint8_t *src = packed + n * row_bytes;
    for (int64_t b0 = 0, blk = 0; b0 < hidden; b0 += FP8_BLOCK, blk++) {
      const int64_t b1 = b0 + FP8_BLOCK < hidden ? b0 + FP8_BLOCK : hidden;
      float scale;
      memcpy(&scale, src + hidden + 4 * blk, sizeof scale);
      if (out_bf16) {
        uint16_t *o = (uint16_t *)out + n * hidden;
        for (int64_t c = b0; c < b1; c++) o[c] = f32_to_bf16(table[src[c]] * scale);
      } else {
        float *o = (float *)out + n * hidden;
        for (int64_t c = b0; c < b1; c++) o[c] = table[src[c]] * scale;
      }
    }
  }
  return 0;
}
