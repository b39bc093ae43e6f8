#pragma once
// What a ZeRO stage shards across the data-parallel ranks, asked by name so that training
// code says why it branches: stage 0 shards nothing (DDP), 1 the optimizer state, 2 the
// gradients too, 3 the parameters too. The number itself is for configs, checkpoints and
// messages.

namespace zeroshard {

class ZeroStage {
 public:
  constexpr ZeroStage() = default;
  constexpr explicit ZeroStage(int number) : number_(number) {}

  constexpr bool shards_optimizer() const { return number_ >= 1; }
  constexpr bool shards_gradients() const { return number_ >= 2; }
  constexpr bool shards_parameters() const { return number_ >= 3; }
  constexpr int number() const { return number_; }

 private:
  int number_ = 0;
};

}  // namespace zeroshard
