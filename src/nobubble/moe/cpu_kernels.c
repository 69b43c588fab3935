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
 * bit-identical. One pass: each row is read once, each output row written once, the float32
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

/* Round to nearest even, as c10::BFloat16; NaN becomes the canonical quiet NaN. */
static inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
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
