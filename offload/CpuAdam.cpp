#include "offload/CpuAdam.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace zeroshard {
namespace {

struct Coefficients {
  float decay;  // 1 - lr * wd (AdamW) or 1
  float l2;     // wd (Adam) or 0
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_bias2;
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  float grad_scale;
};

// Round to nearest even; NaN stays a (quiet) NaN. Branch-free so the loop vectorizes.
inline uint16_t to_bf16(float x) {
  const auto bits = __builtin_bit_cast(uint32_t, x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// Gradients arrive in fp32 or as bf16 bits (widened exactly: bf16 is fp32's top half).
inline float load_grad(float g) {
  return g;
}
inline float load_grad(uint16_t g) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(g) << 16);
}

// One body, compiled once per instruction set below; the loop is plain so the
// compiler vectorizes it for each target.
// The order of operations is ATen's: add_(g, a) is fma(g, a, m * b1); addcmul is
// v * b2 + (a * g) * g; addcdiv is p + (-step * m) / denom. Contraction is off for this
// file, so each operation rounds where torch's does.
#define ZS_ADAM_BODY(FMA, STORE_BF16)                               \
  for (int64_t i = 0; i < n; ++i) {                                 \
    float g = load_grad(grad[i]) * c.grad_scale;                    \
    float p = param[i];                                             \
    g = FMA(p, c.l2, g);                                            \
    p = p * c.decay;                                                \
    const float mi = FMA(g, c.one_minus_beta1, m[i] * c.beta1);     \
    const float vi = v[i] * c.beta2 + (c.one_minus_beta2 * g) * g;  \
    const float denom = __builtin_sqrtf(vi) / c.sqrt_bias2 + c.eps; \
    p = p + (c.neg_step_size * mi) / denom;                         \
    m[i] = mi;                                                      \
    v[i] = vi;                                                      \
    param[i] = p;                                                   \
    STORE_BF16;                                                     \
  }

#define ZS_HW_FMA(a, b, c) __builtin_fmaf(a, b, c)
#define ZS_NO_FMA(a, b, c) ((a) * (b) + (c))

// bf16 == nullptr: no bf16 copy (a separate loop, so the common case has no test inside).
#define ZS_ADAM_KERNEL(FMA)                 \
  if (bf16 == nullptr) {                    \
    ZS_ADAM_BODY(FMA, (void)0)              \
  } else {                                  \
    ZS_ADAM_BODY(FMA, bf16[i] = to_bf16(p)) \
  }

template <typename G>
__attribute__((target("avx512f,avx512bw"))) void kernel_avx512(const Coefficients c, float* param,
                                                               const G* grad, float* m, float* v,
                                                               int64_t n, uint16_t* bf16) {
  ZS_ADAM_KERNEL(ZS_HW_FMA)
}

template <typename G>
__attribute__((target("avx2,fma"))) void kernel_avx2(const Coefficients c, float* param,
                                                     const G* grad, float* m, float* v, int64_t n,
                                                     uint16_t* bf16) {
  ZS_ADAM_KERNEL(ZS_HW_FMA)
}

template <typename G>
void kernel_generic(const Coefficients c, float* param, const G* grad, float* m, float* v,
                    int64_t n, uint16_t* bf16) {
  ZS_ADAM_KERNEL(ZS_NO_FMA)
}

// The sum of the squared gradients, as read (before any scale), in double: sixteen
// independent lanes, so that the loop vectorizes without reassociating anything and
// enough additions are in flight to hide their latency.
#define ZS_SUM_SQUARES_BODY                                         \
  double lanes[16] = {};                                            \
  int64_t i = 0;                                                    \
  for (; i + 16 <= n; i += 16) {                                    \
    for (int j = 0; j < 16; ++j) {                                  \
      const double x = static_cast<double>(load_grad(grad[i + j])); \
      lanes[j] += x * x;                                            \
    }                                                               \
  }                                                                 \
  for (; i < n; ++i) {                                              \
    const double x = static_cast<double>(load_grad(grad[i]));       \
    lanes[i % 16] += x * x;                                         \
  }                                                                 \
  for (int width = 8; width > 0; width /= 2) {                      \
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];   \
  }                                                                 \
  return lanes[0];

template <typename G>
__attribute__((target("avx512f,avx512bw"))) double squares_avx512(const G* grad, int64_t n) {
  ZS_SUM_SQUARES_BODY
}

template <typename G>
__attribute__((target("avx2,fma"))) double squares_avx2(const G* grad, int64_t n) {
  ZS_SUM_SQUARES_BODY
}

template <typename G>
double squares_generic(const G* grad, int64_t n) {
  ZS_SUM_SQUARES_BODY
}

template <typename G>
using Kernel = void (*)(const Coefficients, float*, const G*, float*, float*, int64_t, uint16_t*);
template <typename G>
using Squares = double (*)(const G*, int64_t);

enum class Isa { Avx512, Avx2, Generic };

Isa pick_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
  return Isa::Generic;
}

const Isa kIsa = pick_isa();

// The one of a function's three builds this machine runs.
template <typename F>
F for_this_cpu(F avx512, F avx2, F generic) {
  if (kIsa == Isa::Avx512) return avx512;
  return kIsa == Isa::Avx2 ? avx2 : generic;
}

template <typename G>
Kernel<G> kernel() {
  return for_this_cpu<Kernel<G>>(kernel_avx512<G>, kernel_avx2<G>, kernel_generic<G>);
}

template <typename G>
Squares<G> squares() {
  return for_this_cpu<Squares<G>>(squares_avx512<G>, squares_avx2<G>, squares_generic<G>);
}

}  // namespace

const char* cpu_adam_isa() {
  if (kIsa == Isa::Avx512) return "avx512";
  if (kIsa == Isa::Avx2) return "avx2";
  return "generic";
}

namespace {

template <typename G>
void adam_step(const CpuAdamStep& s, float* param, const G* grad, float* m, float* v, int64_t n,
               uint16_t* bf16_out, double* grad_sum_squares) {
  const Kernel<G> run = kernel<G>();
  const Squares<G> square = squares<G>();
  Coefficients c;
  auto f = [](double x) { return static_cast<float>(x); };
  const AdamHyper& h = s.hyper;
  c.decay = f(h.decoupled ? 1.0 - h.lr * h.weight_decay : 1.0);
  c.l2 = f(h.decoupled ? 0.0 : h.weight_decay);
  c.beta1 = f(h.beta1);
  c.one_minus_beta1 = f(1.0 - h.beta1);
  c.beta2 = f(h.beta2);
  c.one_minus_beta2 = f(1.0 - h.beta2);
  const double t = static_cast<double>(s.step);
  const double bias1 = h.bias_correction ? 1.0 - std::pow(h.beta1, t) : 1.0;
  const double bias2 = h.bias_correction ? 1.0 - std::pow(h.beta2, t) : 1.0;
  c.sqrt_bias2 = f(std::sqrt(bias2));
  c.eps = f(h.eps);
  c.neg_step_size = f(-h.lr / bias1);
  c.grad_scale = f(s.grad_scale);
  // Chunks big enough to stream, small enough to share out across the cores.
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Per chunk, summed in chunk order below: the same sum whatever the thread count.
  std::vector<double> chunk_squares(grad_sum_squares == nullptr ? 0 : chunks);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t begin = k * kChunk;
    const int64_t len = std::min(kChunk, n - begin);
    run(c, param + begin, grad + begin, m + begin, v + begin, len,
        bf16_out == nullptr ? nullptr : bf16_out + begin);
    // Just read by Adam, the chunk's gradients are still in this core's cache.
    if (grad_sum_squares != nullptr) chunk_squares[k] = square(grad + begin, len);
  }
  for (const double x : chunk_squares) *grad_sum_squares += x;
}

}  // namespace

void cpu_adam_step(const CpuAdamStep& s, float* param, const float* grad, float* m, float* v,
                   int64_t n, uint16_t* bf16_out, double* grad_sum_squares) {
  adam_step(s, param, grad, m, v, n, bf16_out, grad_sum_squares);
}

void cpu_adam_step(const CpuAdamStep& s, float* param, const uint16_t* bf16_grad, float* m,
                   float* v, int64_t n, uint16_t* bf16_out, double* grad_sum_squares) {
  adam_step(s, param, bf16_grad, m, v, n, bf16_out, grad_sum_squares);
}

void set_cpu_adam_threads(int threads) {
  omp_set_num_threads(threads);
}

}  // namespace zeroshard
