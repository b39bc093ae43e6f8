"""One rank of the divergence tests: models.TinyGpt at stage 3 on 2 ranks, where rank 1 is
made to part from rank 0 on purpose; writes {"seconds": from initialize to the end,
"error": the message or null, "losses": [...]} to OUT.rankN.json and exits 0 either way.
usage: divergence_worker.py CASE OUT
CASE:
  same     nothing differs (the losses, with and without check_collectives)
  model    rank 1 builds a wider model
  config   rank 1's config has another reduce_bucket_size
  units    rank 1 passes other stage-3 units
  skip     rank 1 leaves out a gather (ZS_TEST_SKIP_AT, set by the test)
  read     rank 1 reads a sharded parameter between steps, which rank 0 does not
ZS_CHECK_COLLECTIVES and ZS_TIMEOUT (comm_timeout_seconds) come from the test."""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

STEPS = 3


def main():
    import zeroshard
    case, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    odd = rank == 1
    model = models.TinyGpt(dim=48 if odd and case == "model" else models.DIM)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,
              "comm_timeout_seconds": float(os.environ.get("ZS_TIMEOUT", "60")),
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "reduce_bucket_size": 1000 if odd and case == "config"
                                    else 2000}}
    units = None
    if case == "units":
        units = [model.blocks] if odd else list(model.blocks)  # one unit, or one per block
    result = {"error": None, "losses": []}
    start = time.monotonic()
    try:
        engine, _, _, _ = zeroshard.initialize(model=model, config=config, units=units)
        for step in range(STEPS):
            loss = engine(models.batch(step, rank, world))
            engine.backward(loss)
            engine.step()
            result["losses"].append(loss.item())
            if case == "read" and odd:
                result["norm"] = model.blocks[0].fc1.weight.norm().item()  # gathered alone
    except Exception as e:  # noqa: BLE001 - the message is what the test reads
        result["error"] = str(e)
    result["seconds"] = time.monotonic() - start
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # the engine is not torn down: a rank that failed may still be in a collective


if __name__ == "__main__":
    main()
