"""One rank of test_reduce_dtype.py: the GPT of models.py, one step of torch's SGD at lr 1
(the update is the reduced gradient itself) under zeroshard for each config in turn.
Writes OUT.rankN.json (per run: the bytes this rank sent during the step), this rank's
own gradient of its batch computed by plain torch (OUT.rankN.grads.pt), and from rank 0
the parameters after each run's step (OUT.rank0.<i>.pt).
usage: reduce_dtype_worker.py OUT CONFIGS_JSON"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def local_grads(rank, world):
    model = models.make("gpt")
    model(models.batch(0, rank, world)).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def one_step(config):
    import zeroshard
    model = models.make("gpt")
    engine, *_ = zeroshard.initialize(model=model, config=config,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=1.0))
    before = engine._engine.bytes_sent()
    engine.backward(engine(models.batch(0, engine.rank, engine.world_size)))
    engine.step()
    return engine._engine.bytes_sent() - before, engine.state_dict()


def main():
    out, configs = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.save(local_grads(rank, world), f"{out}.rank{rank}.grads.pt")
    sent = []
    for i, config in enumerate(configs):
        bytes_sent, params = one_step(config)
        sent.append(bytes_sent)
        if rank == 0:
            torch.save(params, f"{out}.rank0.{i}.pt")
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(sent, f)


if __name__ == "__main__":
    main()
