#pragma once
// AdamW over fp32 arrays in one pass over memory (read p, g, m, v; write p, m, v),
// vectorized for AVX-512 or AVX2 as the CPU running it allows (the build stays plain
// x86-64), split across cores with OpenMP. Optionally in the same pass: the gradient
// multiplied by a scale (loss-scale unscaling, averaging, clipping) and a bf16 copy of
// the updated parameters written out. The arithmetic is torch.optim.AdamW's.
#include <cstdint>

#include "common/AdamHyper.h"

namespace zeroshard {

struct CpuAdamStep {
  AdamHyper hyper;
  int64_t step = 1;  // 1 for the first step (bias correction)
  double grad_scale = 1.0;
};

// bf16_out (may be null): the updated parameters rounded to bf16 (nearest even).
// grad_sum_squares (may be null): gets the sum of the squared gradients added, as read
// (before grad_scale), summed in double; they are read once for both, so a gradient norm
// costs no pass over memory of its own. The sum is the same for any thread count.
void cpu_adam_step(const CpuAdamStep& s, float* param, const float* grad, float* m, float* v,
                   int64_t n, uint16_t* bf16_out = nullptr, double* grad_sum_squares = nullptr);

// The same with the gradients in bf16 (their bits), read as such: no conversion pass.
void cpu_adam_step(const CpuAdamStep& s, float* param, const uint16_t* bf16_grad, float* m,
                   float* v, int64_t n, uint16_t* bf16_out = nullptr,
                   double* grad_sum_squares = nullptr);

// OpenMP's thread count is a setting of each calling thread: a thread other than the
// one that configured torch sets cpu_adam_step's here.
void set_cpu_adam_threads(int threads);

// The instruction set cpu_adam_step uses on this machine: "avx512", "avx2" or "generic".
const char* cpu_adam_isa();

}  // namespace zeroshard
