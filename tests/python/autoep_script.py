"""A Hugging Face mixture-of-experts model trained by DeepSpeed's engine with its experts
split by AutoEP (the config's expert_parallel section): Mixtral (or --model) from
moe_models.py with experts 48 wide (not the hidden size, so that a transposed weight
shows), each rank its own sample a step. tests/python/test_moe.py runs it with DeepSpeed and, its import pointed at
zeroshard, with zeroshard. Writes the losses and gradient norms to --out as JSON.

usage: autoep_script.py --deepspeed_config C --out O --checkpoint FOLDER [--save_at N | --load]
                        [--model NAME]"""
import argparse

import torch

import deepspeed
from moe_models import SHAPE, make
from rank_result import leave

STEPS, SEQ = 6, 12


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True, help="a folder for save/load_checkpoint")
    parser.add_argument("--save_at", type=int, default=0, help="save after this many steps")
    parser.add_argument("--load", action="store_true", help="resume from --checkpoint")
    parser.add_argument("--model", default="mixtral", help="a model of moe_models.py")
    args = deepspeed.add_config_arguments(parser).parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    model = make(args.model, width=48)
    engine, _, _, _ = deepspeed.initialize(args=args, model=model,
                                           model_parameters=model.parameters())
    world, rank = engine.world_size, engine.global_rank
    ids = torch.randint(0, SHAPE["vocab_size"], (STEPS * world, SEQ),
                        generator=torch.Generator().manual_seed(5))
    first = 0
    if args.load:
        _, client = engine.load_checkpoint(args.checkpoint)
        first = client["step"]
    seen = {"losses": [], "norms": []}
    for step in range(first, STEPS):
        sample = ids[step * world + rank][None]
        loss = engine(input_ids=sample, labels=sample).loss
        engine.backward(loss)
        engine.step()
        seen["losses"].append(loss.item())
        seen["norms"].append(float(engine.get_global_grad_norm()))
        if args.save_at == step + 1:
            engine.save_checkpoint(args.checkpoint, client_state={"step": step + 1})
    leave(args.out, seen)  # rank_result.py says why


if __name__ == "__main__":
    main()
