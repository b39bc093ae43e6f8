"""The same loop with zeroshard: ZeRO-2 (gradients and Adam state sharded over ranks).
Run: ./zs run -n 2 examples/minimal_zeroshard.py"""
import torch

import zeroshard


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    config = {"zero_optimization": {"stage": 2},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
    engine, optimizer, _, _ = zeroshard.initialize(model=model, config=config)
    for step in range(100):
        x = torch.randn(32, 64)
        loss = torch.nn.functional.mse_loss(engine(x), x)
        engine.backward(loss)
        engine.step()
        if engine.rank == 0 and step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
