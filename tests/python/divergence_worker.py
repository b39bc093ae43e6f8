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
  exchange on a sequence-parallel group made before the engine, rank 0 runs an attention's
           Ulysses all-to-all, which rank 1 never joins (it sleeps, then ends)
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
        if case == "exchange":
            return exchange(zeroshard, model, config, rank, result, start, out)
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
    finish(result, start, out, rank)


def finish(result, start, out, rank):
    result["seconds"] = time.monotonic() - start
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    os._exit(0)  # the engine is not torn down: a rank that failed may still be in a collective


def exchange(zeroshard, model, config, rank, result, start, out):
    """The groups are made before initialize (with the default timeout); initialize gives
    them the config's comm_timeout_seconds."""
    from zeroshard.runtime.sequence_parallel import parallel_state_sp
    from zeroshard.sequence.layer import DistributedAttention
    zeroshard.init_distributed()
    parallel_state_sp.initialize_sequence_parallel(2)
    zeroshard.initialize(model=model, config=config, mpu=parallel_state_sp)
    start = time.monotonic()
    if rank == 1:
        time.sleep(config["comm_timeout_seconds"] + 4)  # never joins; ends after rank 0
        return finish(result, start, out, rank)
    attention = DistributedAttention(lambda q, k, v, *args, **kwargs: q,
                                     parallel_state_sp.get_sequence_parallel_group())
    x = torch.zeros(1, 4, 2, 8)  # [batch, this rank's tokens, heads, head width]
    try:
        attention(x, x, x, 0)
    except Exception as e:  # noqa: BLE001 - the message is what the test reads
        result["error"] = str(e)
    finish(result, start, out, rank)


if __name__ == "__main__":
    main()
