// LambOptimizer against DeepSpeed FusedLamb's arithmetic written out per whole parameter:
// a shard holding two parameters (pieces of one flat buffer) steps each with its own
// trust ratio, and the norms pass through the reduce hook (which multi-rank runs use to
// sum them across shards; tests/python/test_optimizers.py checks that on 2 ranks).
#include "optim/LambOptimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using namespace zeroshard;

namespace {

// One FusedLamb step of a whole parameter `w` (bias correction on, eps outside the root).
void reference_step(at::Tensor& w, at::Tensor& m, at::Tensor& v, const at::Tensor& g,
                    const AdamHyper& h, int64_t t, const LambOptions& o) {
  m.mul_(h.beta1).add_(g, 1 - h.beta1);
  v.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
  const at::Tensor u = m / (v.sqrt() + h.eps) + h.weight_decay * w;
  const double wn = w.norm().item<double>(), un = u.norm().item<double>();
  const double ratio = (wn > 0 && un > 0) ? std::clamp(wn / un, o.min_coeff, o.max_coeff) : 1.0;
  const double step = h.lr * std::sqrt(1 - std::pow(h.beta2, t)) / (1 - std::pow(h.beta1, t));
  w.add_(u, -step * ratio);
}

}  // namespace

TEST(LambOptimizer, EachParameterStepsWithItsOwnTrustRatioAsWholeFusedLamb) {
  at::manual_seed(5);
  MemoryLedger ledger;
  LambOptions o;
  o.max_coeff = 3.0;
  o.min_coeff = 0.05;
  int reduced = 0;
  LambOptimizer opt(o, Tier::Device, &ledger, [&](at::Tensor& norms) {
    EXPECT_EQ(norms.sizes(), (std::vector<int64_t>{2, 2}));  // ||w||^2, ||u||^2 per parameter
    ++reduced;
  });
  // Parameter 0: 6 elements of scale 1; parameter 1: 4 elements of scale 1e-3 (its ratio
  // clamps at min_coeff); then 2 elements of padding.
  at::Tensor shard = at::cat({at::randn({6}), at::randn({4}) * 1e-3, at::zeros({2})});
  at::Tensor w0 = shard.narrow(0, 0, 6).clone(), w1 = shard.narrow(0, 6, 4).clone();
  opt.add_group(shard);
  opt.add_param_pieces(0, {{0, 6, 0, 0, {6}, "w0"}, {6, 4, 1, 0, {4}, "w1"}}, 2);
  EXPECT_EQ(ledger.current(Tier::Device, Kind::OptimizerStates), 12 * 8);
  AdamHyper h;
  h.lr = 0.1;
  h.weight_decay = 0.01;
  at::Tensor m0 = at::zeros({6}), v0 = at::zeros({6}), m1 = at::zeros({4}), v1 = at::zeros({4});
  for (int64_t t = 1; t <= 3; ++t) {
    const at::Tensor g = at::cat({at::randn({10}), at::zeros({2})});
    opt.step({(g * 2).contiguous()}, /*grad_scale=*/0.5, h);
    reference_step(w0, m0, v0, g.narrow(0, 0, 6), h, t, o);
    reference_step(w1, m1, v1, g.narrow(0, 6, 4), h, t, o);
    EXPECT_TRUE(at::allclose(shard.narrow(0, 0, 6), w0, 1e-6, 1e-7)) << "step " << t;
    EXPECT_TRUE(at::allclose(shard.narrow(0, 6, 4), w1, 1e-6, 1e-9)) << "step " << t;
    EXPECT_TRUE(at::equal(shard.narrow(0, 10, 2), at::zeros({2})));  // padding stays zero
  }
  EXPECT_EQ(reduced, 3);
  std::vector<float> master(12), m(12), v(12);
  opt.read_state(0, std::vector<float*>{master.data(), m.data(), v.data()});
  EXPECT_FLOAT_EQ(m[7], m1[1].item<float>());
}
