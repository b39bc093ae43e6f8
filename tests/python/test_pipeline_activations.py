"""Pipeline stages' activations as planned: a Llama split in two stages at ZeRO stage 3
(tests/python/pp_activation_worker.py), 4 micro-batches of 2 x 128 tokens in bf16, run by
torch's GPipe and 1F1B schedules through zeroshard.pipelining (and in four stages, two on
each rank, by its Interleaved1F1B). Each stage's bytes kept for
backward at their peak during a step (torch's saved-tensor hooks, every storage counted
while it lives, with the outputs the schedule holds) against zeroshard-estimate --pp 2's
activations for that stage and schedule (--pp-schedule interleaved1f1b: two stages a rank) (plan/MemoryModel.cpp activation_bytes)."""
import importlib.util
import json
import os
import subprocess

import pytest

from conftest import BUILD, HERE, run_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed beside this interpreter (the trixie leg)")

MICRO, SEQ, MICROBATCHES = 2, 128, 4


def planned(config_path, schedule, scratch):
    """zeroshard-estimate's activation bytes of each stage."""
    config = scratch / "zeroshard.json"
    config.write_text(json.dumps({"gradient_accumulation_steps": MICROBATCHES,
                                  "zero_optimization": {"stage": 3}}))
    out = subprocess.run(
        [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config", config_path,
         "--pp", "2", "--pp-schedule", schedule, "--gpus-per-node", "2", "--seq", str(SEQ),
         "--micro-batch", str(MICRO), "--bf16", "--config", str(config), "--json"],
        capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    stages = json.loads(out.stdout)["stages"]
    return [s["bytes_by_kind"]["device"]["activations"] for s in stages]


def test_each_stages_activation_peak_is_the_plans_and_1f1b_holds_less(scratch):
    import transformers
    path = str(scratch / "config.json")
    transformers.LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688,
                             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                             max_position_embeddings=SEQ).to_json_file(path)
    worker = os.path.join(HERE, "pp_activation_worker.py")
    measured = {}
    for schedule in ("gpipe", "1f1b", "interleaved1f1b"):
        out = str(scratch / schedule)
        ranks = run_ranks([worker, out, path, schedule, str(MICRO), str(SEQ), str(MICROBATCHES)],
                          2, out, timeout=300)
        ranks = sorted(ranks, key=lambda r: r["stage"])
        measured[schedule] = [r["peak"] for r in ranks]
        plan = planned(path, schedule, scratch)
        for stage, (got, want) in enumerate(zip(measured[schedule], plan)):
            print(f"{schedule} stage {stage}: kept {got} bytes at the peak, planned {want} "
                  f"({got / want:.3f})")
            assert abs(got - want) <= 0.05 * got, (schedule, stage, got, want)
            # The engine of one stage (its module keeps the model's config) predicts the
            # same in memory_report: its own blocks, the head where it holds it, and the
            # micro-batches the schedule held at once. (The interleaved ranks' modules are
            # lists of stages without a config: model states only.)
            if schedule != "interleaved1f1b":
                reported = ranks[stage]["reported"]
                print(f"  memory_report predicted {reported} ({got / reported:.3f})")
                assert abs(reported - want) <= 0.01 * want, (schedule, stage, reported, want)
    # 1F1B: stage s holds pp - s micro-batches, GPipe all 4 (the last stage's logits of every
    # micro-batch stay under both, until step() returns them).
    for stage in (0, 1):
        assert measured["1f1b"][stage] < measured["gpipe"][stage], measured
    # Interleaved: rank 0 holds 5 micro-batches of a one-block stage at its peak (its 4
    # warm-up forwards and one more) against 1F1B's 2 of two blocks.
    assert measured["interleaved1f1b"][0] > measured["1f1b"][0], measured
