"""A mixture-of-experts training script written as DeepSpeedExamples' cifar10_deepspeed.py
writes its --moe path: deepspeed.moe.layer.MoE between two dense layers, the optimizer's
groups from split_params_into_different_moe_groups_for_optimizer, the gate's l_aux added
to the loss. tests/python/test_moe.py runs it with DeepSpeed and, its import lines pointed
at zeroshard, with zeroshard. Writes the losses, l_aux, the experts' token counts and the
gradient norms to --out as JSON; with --save_16bit, the model by save_16bit_model.

usage: moe_script.py --deepspeed_config C --out O --top_k K [--noisy_gate_policy P]
       [--use_residual] [--min_capacity N] [--ep_size N] [--save_16bit FOLDER] [--zero_init]
       [--distinct_experts] [--checkpoint FOLDER [--save_at N | --load]]"""
import argparse

import torch
import torch.nn as nn

import deepspeed
import deepspeed.comm as dist
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from rank_result import leave

STEPS, ROWS, WIDTH, EXPERTS = 6, 8, 16, 4


class Net(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.fc1 = nn.Linear(12, WIDTH)
        self.moe = deepspeed.moe.layer.MoE(
            hidden_size=WIDTH, expert=nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU()),
            num_experts=EXPERTS, ep_size=args.ep_size, k=args.top_k, min_capacity=args.min_capacity,
            noisy_gate_policy=args.noisy_gate_policy, use_residual=args.use_residual)
        self.fc3 = nn.Linear(WIDTH, 5)
        if args.distinct_experts:  # each rank's experts values of their own
            with torch.no_grad():
                for i, expert in enumerate(self.moe.deepspeed_moe.experts.deepspeed_experts):
                    g = torch.Generator().manual_seed(100 + dist.get_rank() * EXPERTS + i)
                    expert[0].weight.copy_(0.2 * torch.randn(WIDTH, WIDTH, generator=g))

    def forward(self, x):
        x, l_aux, counts = self.moe(torch.relu(self.fc1(x)))
        return self.fc3(x), l_aux, counts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--out", required=True)
    parser.add_argument("--top_k", type=int, default=1)
    parser.add_argument("--min_capacity", type=int, default=1)
    parser.add_argument("--noisy_gate_policy", default=None)
    parser.add_argument("--use_residual", action="store_true")
    parser.add_argument("--ep_size", type=int, default=1)
    parser.add_argument("--save_16bit", default=None, help="a folder for save_16bit_model")
    parser.add_argument("--checkpoint", default=None, help="a folder for save/load_checkpoint")
    parser.add_argument("--save_at", type=int, default=0, help="save after this many steps")
    parser.add_argument("--load", action="store_true", help="resume from --checkpoint")
    parser.add_argument("--zero_init", action="store_true", help="build it in zero.Init")
    parser.add_argument("--distinct_experts", action="store_true",
                        help="give each rank's experts initial values of their own")
    args = deepspeed.add_config_arguments(parser).parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    if args.zero_init:  # each rank keeps its shards as the model is built (ZeRO 3)
        with deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config):
            net = Net(args)
    else:
        net = Net(args)
    parameters = {"params": [p for p in net.parameters() if p.requires_grad],
                  "name": "parameters"}
    groups = split_params_into_different_moe_groups_for_optimizer(parameters)
    # As split (DeepSpeed's engine flattens each group's params in place at ZeRO 1-2)
    seen = {"groups": [(g.get("name"), bool(g.get("moe")), len(g["params"])) for g in groups],
            "losses": [], "l_aux": [], "counts": [], "norms": []}
    engine, _, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=groups)
    torch.manual_seed(1234 + dist.get_rank())  # the gate's draws: the same in both runs
    criterion = nn.CrossEntropyLoss()
    first = 0
    if args.load:
        _, client = engine.load_checkpoint(args.checkpoint)
        first = client["step"]
    for step in range(first, STEPS):
        g = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x, y = torch.randn(ROWS, 12, generator=g), torch.randint(5, (ROWS,), generator=g)
        out, l_aux, counts = engine(x)
        loss = criterion(out, y) + 0.01 * l_aux
        engine.backward(loss)
        engine.step()
        seen["losses"].append(loss.item())
        seen["l_aux"].append(l_aux.item())
        seen["counts"].append(counts.tolist())
        seen["norms"].append(float(engine.get_global_grad_norm()))
        if args.save_at == step + 1:
            engine.save_checkpoint(args.checkpoint, client_state={"step": step + 1})
    if args.save_16bit:
        engine.save_16bit_model(args.save_16bit)
    leave(args.out, seen)  # rank_result.py says why


if __name__ == "__main__":
    main()
