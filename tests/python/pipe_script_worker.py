"""One rank of a script in the shape of DeepSpeedExamples' pipeline-parallel CIFAR example,
run by DeepSpeed itself (mode deepspeed, its CPU accelerator over Gloo) or with its
deepspeed imports switched to zeroshard's (mode zeroshard), nothing else changed: a small
convolutional network given as PipelineModule layers with a lambda (flatten) between them,
a dataset handed to initialize as training_data, and engine.train_batch() with no
iterator, so each stage reads the engine's own loader. It trains twice in one process,
with dropout 0 and DROPOUT, STEPS steps each, and writes OUT.rankN.json: each run's
returned losses.
usage: pipe_script_worker.py deepspeed|zeroshard STEPS DROPOUT OUT --deepspeed_config FILE"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn

from rank_result import leave

mode, steps, dropout, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if mode == "deepspeed":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_SIZE", os.environ["WORLD_SIZE"])
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from deepspeed.utils import RepeatingLoader  # noqa: F401  (the script imports it)
else:
    import zeroshard as deepspeed
    from zeroshard.pipe import PipelineModule
    from zeroshard.utils import RepeatingLoader  # noqa: F401


def get_args():
    parser = argparse.ArgumentParser(description="CIFAR-shaped")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("-p", "--pipeline-parallel-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1138)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args(sys.argv[5:])


class Images(torch.utils.data.Dataset):
    """36 small images of 10 classes: 18 per rank at DP2, so a pass of 9 micro-batches of 2
    ends inside a step of 4."""

    def __init__(self):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(36, 3, 8, 8, generator=g)
        self.y = torch.randint(0, 10, (36,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def join_layers(p):
    return [nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
            lambda x: torch.flatten(x, 1),
            nn.Dropout(p), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 10)]


def train_pipe(args, p):
    torch.manual_seed(args.seed)
    deepspeed.runtime.utils.set_random_seed(args.seed)
    net = PipelineModule(layers=join_layers(p), loss_fn=torch.nn.CrossEntropyLoss(),
                         num_stages=args.pipeline_parallel_size, partition_method="parameters",
                         activation_checkpoint_interval=0)
    engine, _, _, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=[q for q in net.parameters() if q.requires_grad],
        training_data=Images())
    return [float(engine.train_batch()) for _ in range(steps)]


if __name__ == "__main__":
    torch.set_num_threads(1)
    args = get_args()
    deepspeed.init_distributed(dist_backend="gloo")
    args.local_rank = int(os.environ["LOCAL_RANK"])
    result = {"losses": {str(p): train_pipe(args, p) for p in (0.0, dropout)}}
    if mode == "deepspeed":
        leave(out, result)  # rank_result.py says why
    with open(f"{out}.rank{os.environ['RANK']}.json", "w") as f:
        json.dump(result, f)
