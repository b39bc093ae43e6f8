"""One rank of a PyTorch Lightning run of a small GPT (models.TinyGpt as a LightningModule:
AdamW over decay and no-decay groups, a warmup LambdaLR stepped every optimizer step,
accumulate_grad_batches 2, gradient_clip_val), under Lightning's DDPStrategy (strategy
"ddp") or zeroshard's (a ZeroShardStrategy config, or a registered name). ModelCheckpoint
saves at every epoch's end. Writes every micro-batch's loss, every step's gradient norm
(before clipping), validate()'s metric and the whole parameters to OUT.rankN.json.
usage: lightning_worker.py OUT JSON  (JSON: strategy, config, epochs, ckpt_dir, resume,
precision, rows, configure_model)"""
import json
import os
import sys

import lightning as L
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import devices  # noqa: E402
import models  # noqa: E402

MICRO, ACCUMULATION, CLIP = 2, 2, 0.05


class Gpt(L.LightningModule):
    def __init__(self, build_later=False):
        super().__init__()
        self.model = None if build_later else self.build()
        self.losses, self.norms = [], []  # every micro-batch's loss, every step's grad norm

    @staticmethod
    def build():
        torch.manual_seed(0)
        return models.TinyGpt()

    def configure_model(self):
        if self.model is None:  # built under the strategy's sharded-construction context
            self.model = self.build()

    def forward(self, tokens):
        return self.model(tokens)

    def training_step(self, batch, batch_idx):
        loss = self(batch)
        self.losses.append(loss.item())
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def on_before_optimizer_step(self, optimizer):
        if getattr(self.trainer.strategy, "engine", None) is None:  # DDP: unclipped grads here
            norms = [p.grad.norm() for p in self.parameters() if p.grad is not None]
            self.norms.append(torch.stack(norms).norm().item())

    def on_train_batch_end(self, outputs, batch, batch_idx):
        engine = getattr(self.trainer.strategy, "engine", None)
        if engine is not None and (batch_idx + 1) % ACCUMULATION == 0:
            self.norms.append(engine.get_global_grad_norm())  # the step's, before clipping

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self(batch), sync_dist=True)

    def configure_optimizers(self):
        decay = [p for n, p in self.named_parameters() if "ln" not in n]
        rest = [p for n, p in self.named_parameters() if "ln" in n]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                       {"params": rest, "weight_decay": 0.0}], lr=1e-2,
                                      betas=(0.9, 0.95))
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def loader(rows, seed, shuffle):
    tokens = torch.randint(models.VOCAB, (rows, models.SEQ + 1),
                           generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(list(tokens), batch_size=MICRO, shuffle=shuffle)


def strategy_of(spec):
    if spec["strategy"] == "ddp":
        return "ddp"
    from zeroshard.integrations import ZeroShardStrategy
    if spec.get("config") is None:
        return spec["strategy"]  # a registered name
    return ZeroShardStrategy(config=spec["config"])


def main():
    out, spec = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)
    callbacks = []
    if spec.get("ckpt_dir"):
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=spec["ckpt_dir"], save_top_k=-1, every_n_epochs=1))
    gpu = devices.device().type == "cuda"  # (the model is left on the host: the strategy places it)
    trainer = L.Trainer(accelerator="gpu" if gpu else "cpu",
                        devices=int(os.environ["WORLD_SIZE"]),
                        strategy=strategy_of(spec), max_epochs=spec.get("epochs", 2),
                        accumulate_grad_batches=ACCUMULATION, gradient_clip_val=CLIP,
                        precision=spec.get("precision", "32-true"), logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=callbacks,
                        enable_checkpointing=bool(callbacks))
    module = Gpt(build_later=spec.get("configure_model", False))
    train = loader(spec.get("rows", 32), 7, True)
    trainer.fit(module, train, ckpt_path=spec.get("resume"))
    metric = trainer.validate(module, loader(8, 11, False), verbose=False)[0]["val_loss"]
    engine = getattr(trainer.strategy, "engine", None)
    state = engine.state_dict() if engine is not None else module.state_dict()
    result = {"losses": module.losses, "norms": module.norms, "val_loss": float(metric), "global_step": trainer.global_step,
              "params": {k: v.float().tolist() for k, v in state.items()}}
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
