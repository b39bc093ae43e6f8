"""The estimator's activation bytes against what transformers' models really keep for
backward, counted another way: torch's saved-tensor hooks during a training forward (bf16,
on the CPU), every distinct storage that is not a parameter, plus the logits the model
returns. Models are built from their configs (random weights, nothing downloaded).

Held to 3% for the families whose blocks plan/MemoryModel.cpp describes: Llama with
grouped-query attention (sdpa and eager), Qwen2 (q/k/v biases), Mixtral (two experts a
token), GPT-2 (LayerNorm, a tanh GELU written in torch operations), GPT-NeoX."""
import importlib.util
import json
import os
import subprocess

import pytest

from conftest import BUILD, HERE, run_ranks, run_snippet

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed beside this interpreter (the trixie leg): the "
           "main leg runs these tests")

SEQ, BATCH = 256, 2


def configs():
    import transformers as t
    llama = dict(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=SEQ)
    return {
        "llama": t.LlamaConfig(**llama),
        "llama-eager": t.LlamaConfig(**llama, attn_implementation="eager"),
        "qwen2": t.Qwen2Config(**llama),
        "mixtral": t.MixtralConfig(**llama, num_local_experts=4, num_experts_per_tok=2),
        "gpt2": t.GPT2Config(vocab_size=1000, n_embd=256, n_layer=2, n_head=8, n_positions=SEQ,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
        "gpt_neox": t.GPTNeoXConfig(vocab_size=1000, hidden_size=256, intermediate_size=1024,
                                    num_hidden_layers=2, num_attention_heads=8,
                                    max_position_embeddings=SEQ, hidden_dropout=0.0,
                                    attention_dropout=0.0),
    }


def saved_storages(model):
    """({storage: its bytes}, a saved-tensors pack hook filling it): every storage a forward
    saves for backward, once, that is not one of the model's parameters."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = max(saved.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor
    return saved, pack


def kept_for_backward(config, checkpointing=False, tokens=None):
    """Bytes a training forward keeps: saved tensors (each storage once) and the logits.
    tokens: (first, last) of the SEQ positions given (a rank's slice of each sequence), all
    by default."""
    import torch
    import transformers
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    saved, pack = saved_storages(model)
    ids = torch.randint(config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    first, last = tokens or (0, SEQ)
    ids, positions = ids[:, first:last], torch.arange(first, last).expand(BATCH, -1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = model(input_ids=ids, labels=ids, position_ids=positions)
    logits = out.logits.untyped_storage()
    return sum(saved.values()) + (0 if logits.data_ptr() in saved else logits.nbytes())


def estimated(config, scratch, *flags):
    path = scratch / "config.json"
    config.to_json_file(str(path))
    out = subprocess.run(
        [os.path.join(BUILD, "tools", "zeroshard-estimate"), "--hf-config", str(path),
         "--micro-batch", str(BATCH), "--bf16", "--json",
         "--attn-implementation", config._attn_implementation or "sdpa", *flags,
         *([] if "--seq" in flags else ["--seq", str(SEQ)])],
        capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)["options"][0]["bytes_by_kind"]["device"]["activations"]


@pytest.mark.parametrize("family", ["llama", "llama-eager", "qwen2", "mixtral", "gpt2",
                                    "gpt_neox"])
def test_estimated_activations_are_what_the_model_keeps(family, scratch):
    config = configs()[family]
    kept = kept_for_backward(config)
    predicted = estimated(config, scratch)
    assert abs(predicted - kept) <= 0.03 * kept, \
        f"{family}: estimated {predicted} bytes of activations, the model kept {kept}"


def test_checkpointed_activations_are_the_block_inputs_and_one_block(scratch):
    """With gradient checkpointing a forward keeps each block's input; backward recomputes
    one block at a time, whose activations are measured as a second block's saved bytes."""
    import copy
    config = copy.deepcopy(configs()["llama"])
    config.num_hidden_layers = 8  # the inputs weigh: counted twice they are 12% more
    fewer = copy.deepcopy(config)
    fewer.num_hidden_layers = 7
    block = kept_for_backward(config) - kept_for_backward(fewer)
    kept = kept_for_backward(config, checkpointing=True)
    predicted = estimated(config, scratch, "--activation-checkpointing")
    assert abs(predicted - (kept + block)) <= 0.03 * (kept + block), \
        f"estimated {predicted}, kept {kept} and one block {block}"


def split_over_ranks(how, world, scratch):
    """The Llama's sequences split over `world` ranks (how: "sp" Ulysses, "cp" ring
    attention, by tests/python/{how}_activation_worker.py): each rank's results, the
    estimate of a slice run alone, the estimate with --{how} world."""
    out = scratch / how
    ranks = run_ranks([os.path.join(HERE, f"{how}_activation_worker.py"), str(out)], world, out)
    config = configs()["llama"]
    slice_alone = estimated(config, scratch, "--seq", str(SEQ // world))
    return ranks, slice_alone, estimated(config, scratch, f"--{how}", str(world),
                                         "--gpus-per-node", str(world))


def test_sequence_parallel_activations_are_a_slice_and_the_exchange(scratch):
    """Ulysses over 4 ranks (ALST's registration with transformers; a Llama with 8 query and
    2 key-value heads, so keys and values are repeated to one head per rank): each rank
    keeps its slice's activations, as the model run on those SEQ/4 tokens alone keeps,
    and per layer and slice token the output projection's exchanged input (heads x
    head_dim) and the repeated keys and values ((4 - 2) x 2 x head_dim) besides;
    zeroshard-estimate --sp 4 counts both, to the byte, and so do zeroshard.estimate with the
    config's sequence_parallel_size 4 and the memory report of an engine with that key
    trained on those slices."""
    world = 4
    ranks, slice_alone, predicted = split_over_ranks("sp", world, scratch)
    config = configs()["llama"]
    head_dim, heads, kv_heads, layers = 32, 8, 2, 2
    exchange = layers * BATCH * (SEQ // world) * 2 * (heads + 2 * (world - kv_heads)) * head_dim
    for rank in ranks:
        assert rank["kept"] - rank["slice_alone"] == exchange == predicted - slice_alone
        assert abs(predicted - rank["kept"]) <= 0.03 * rank["kept"], (predicted, rank["kept"])
        assert rank["predicted"] == predicted
    # zeroshard.estimate reads the key from the config it is given.
    import torch
    import transformers
    import zeroshard
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    plan = zeroshard.estimate(model, {"bf16": {"enabled": True}, "sequence_parallel_size": world},
                              gpus_per_node=world, seq=SEQ, micro_batch=BATCH)
    assert {o["activation_bytes"] for o in plan["options"]} == {predicted}


def test_context_parallel_activations_are_a_slice_and_the_merged_output(scratch):
    """torch's ring attention over 4 ranks (context_parallel over a "cp" mesh, head-tail load
    balancing): every rank but the ring's last keeps its slice's activations, as the model
    run on those SEQ/4 tokens alone keeps, and per layer and slice token one more attention
    output (heads x head_dim, the partial outputs merged); the last keeps the slice's alone.
    zeroshard-estimate --cp 4 counts the larger, to the byte, and so does the memory report
    of an engine given a ("dp", "cp") mesh trained on those slices."""
    world = 4
    ranks, slice_alone, predicted = split_over_ranks("cp", world, scratch)
    head_dim, heads, layers = 32, 8, 2
    merged = layers * BATCH * (SEQ // world) * 2 * heads * head_dim
    assert [rank["kept"] - rank["slice_alone"] for rank in ranks] == [merged] * 3 + [0]
    assert predicted - slice_alone == merged
    for rank in ranks:
        assert abs(predicted - rank["kept"]) <= 0.03 * rank["kept"], (predicted, rank["kept"])
        assert rank["predicted"] == predicted


def tiled_kept(config, mlp_tiles, logits_tiles):
    """What a Llama keeps for backward under ALST's tiled compute (zeroshard's TiledMLP in
    every MLP, the logits with their loss summed by TiledFusedLogitsLoss over the base
    model's last hidden states; 0: not tiled, the loss made from whole logits): the saved
    tensors (each storage once) and the gradients the tiled loss holds until backward; and
    those gradients' bytes alone."""
    import types
    import torch
    import torch.nn.functional as F
    import transformers
    from zeroshard.runtime.sequence_parallel.ulysses_sp import TiledFusedLogitsLoss, TiledMLP
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()

    def mlp(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    for layer in model.model.layers if mlp_tiles else []:
        layer.mlp.forward = types.MethodType(
            lambda self, x: TiledMLP.apply(mlp, self, x, mlp_tiles), layer.mlp)
    saved, pack = saved_storages(model)

    def loss_sum(head, x, y):
        return F.cross_entropy(head(x).float().view(-1, config.vocab_size), y.reshape(-1),
                               ignore_index=-100, reduction="sum")

    ids = torch.randint(config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = F.pad(ids, (0, 1), value=-100)[:, 1:]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        hidden = model.model(input_ids=ids, position_ids=torch.arange(SEQ).expand(BATCH, -1))
        hidden = hidden.last_hidden_state
        if not logits_tiles:
            loss_sum(model.lm_head, hidden, labels)
    held = 0
    if logits_tiles:  # its tiles' graphs are made and freed inside: outside the hooks
        node = TiledFusedLogitsLoss.apply(loss_sum, model.lm_head, hidden, labels, None,
                                          logits_tiles, [model.lm_head.weight], "sum").grad_fn
        held = node.x_grad.nbytes + sum(g.nbytes for g in node.param_grads if g is not None)
    return sum(saved.values()) + held, held


def test_tiled_mlp_and_logits_keep_what_the_estimate_counts(scratch):
    """ALST's TiledMLP (4 tiles) keeps each MLP's input alone: per layer and token its four
    intermediates of 688 (gate, activation, up, product; bf16) less, measured to the byte;
    TiledFusedLogitsLoss (2 tiles) keeps no logits and holds its gradients until backward:
    the hidden states' and the head weight's, whole. zeroshard-estimate --tiled-mlp and
    --tiled-logits count both, and what a tile holds while it runs: one MLP tile's
    intermediates again in backward, one tile's logits and fp32 log-probabilities in
    forward; besides those, within 3% of what the model keeps."""
    config = configs()["llama"]
    config._attn_implementation = "sdpa"
    tokens, hidden, inner, vocab, layers, kl = BATCH * SEQ, 256, 688, 1000, 2, 2
    plain, _ = tiled_kept(config, 0, 0)
    mlp_kept, _ = tiled_kept(config, 4, 0)
    logits_kept, held = tiled_kept(config, 0, 2)
    both, _ = tiled_kept(config, 4, 2)
    mlp_tile = tokens // 4 * 4 * kl * inner
    logits_tile = tokens // 2 * vocab * (kl + 4)
    assert plain - mlp_kept == layers * tokens * 4 * kl * inner
    assert held == tokens * hidden * kl + vocab * hidden * kl
    estimate = {flags: estimated(config, scratch, *flags) for flags in (
        (), ("--tiled-mlp", "4"), ("--tiled-logits", "2"),
        ("--tiled-mlp", "4", "--tiled-logits", "2"))}
    assert estimate[()] - estimate[("--tiled-mlp", "4")] == plain - mlp_kept - mlp_tile
    # The hidden states' gradient takes the place of the norm's output the head kept.
    assert estimate[()] - estimate[("--tiled-logits", "2")] == \
        tokens * vocab * (kl + 4) - (held - tokens * hidden * kl) - logits_tile
    for kept, flags, tiles in ((logits_kept, ("--tiled-logits", "2"), logits_tile),
                               (both, ("--tiled-mlp", "4", "--tiled-logits", "2"),
                                mlp_tile + logits_tile)):
        predicted = estimate[flags] - tiles
        assert abs(predicted - kept) <= 0.03 * kept, (flags, predicted, kept)


@pytest.mark.parametrize("family", ["llama", "mixtral", "gpt2"])
def test_python_estimate_counts_the_live_models_activations(family, scratch):
    """zeroshard.estimate(model, seq=...) reads the model's own config and attention: the
    CLI's bytes on its config.json, and within 3% of what the model keeps."""
    import torch
    import transformers
    import zeroshard
    config = configs()[family]
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    plan = zeroshard.estimate(model, {"bf16": {"enabled": True}}, seq=SEQ, micro_batch=BATCH)
    assert plan["activations"] == "counted"
    assert {o["activation_bytes"] for o in plan["options"]} == {estimated(config, scratch)}
    kept = kept_for_backward(config)
    assert abs(plan["options"][0]["activation_bytes"] - kept) <= 0.03 * kept
    without = zeroshard.estimate(model, gpu_memory="80GB")
    assert without["activations"].startswith("not counted: pass seq=")
    assert {o["activation_bytes"] for o in without["options"]} == {0}


def test_python_estimate_with_seq_needs_a_config():
    import torch
    import zeroshard
    with pytest.raises(ValueError, match=r"seq=128 needs the model's shape, read from a "
                                         r"Hugging Face config \(model.config\); Linear has"):
        zeroshard.estimate(torch.nn.Linear(4, 4), seq=128)
    model = __import__("transformers").AutoModelForCausalLM.from_config(configs()["llama"])
    with pytest.raises(ValueError, match=r"micro_batch=0 is not allowed; allowed: a positive"):
        zeroshard.estimate(model, seq=128, micro_batch=0)


def run_with_llama(config, scratch, body):
    """run_snippet with `llama`, a LlamaForCausalLM of `config`, built first."""
    path = scratch / "config.json"
    config.to_json_file(str(path))
    return run_snippet(
        "import json, transformers\n"
        f"hf = transformers.LlamaConfig.from_json_file({str(path)!r})\n"
        "llama = transformers.LlamaForCausalLM(hf)\n" + body)


def printed(out, tag):
    """The JSON a snippet printed after `tag`."""
    return json.loads(out.split(f"{tag} ", 1)[1].splitlines()[0])


def test_memory_report_predicts_the_activations_of_the_batch_trained_on(scratch):
    """A Hugging Face model on the engine: memory_report()'s device prediction counts the
    activations of the largest micro-batch trained on so far, the estimator's bytes for
    that config and batch; a model without a config predicts model states alone."""
    config = configs()["llama"]
    code, out = run_with_llama(
        config, scratch,
        "cfg = {'train_micro_batch_size_per_gpu': 1, 'bf16': {'enabled': True},\n"
        "       'zero_optimization': {'stage': 3}, 'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}}}\n"
        "def predicted(m, batches):\n"
        "    e = zeroshard.initialize(model=m, config=cfg)[0]\n"
        "    for x in batches:\n"
        "        e.backward(e(**x).loss if hasattr(m, 'config') else e(x).sum()); e.step()\n"
        "    return e.memory_report()['device']['kinds']['activations']['predicted']\n"
        "ids = lambda b, s: {'input_ids': torch.zeros(b, s, dtype=torch.long), 'labels': torch.zeros(b, s, dtype=torch.long)}\n"
        f"got = predicted(llama, [ids(1, {SEQ}), ids({BATCH}, {SEQ}), ids(1, 8)])\n"
        "plain = predicted(model, [torch.ones(2, 4, dtype=torch.bfloat16)])\n"
        "print('REPORT', json.dumps([got, plain]))\n")
    assert code == 0, out
    got, plain = printed(out, "REPORT")
    assert got == estimated(config, scratch) and got > 0
    assert plain == 0


def test_ratio_auto_at_initialize_leaves_room_for_the_models_longest_sequence(scratch):
    """offload_optimizer.ratio auto, decided when the engine is built, before any batch:
    for a Hugging Face model the plan counts micro-batches of its longest sequence
    (max_position_embeddings, gradient checkpointing as the model has it), as
    zeroshard.estimate does for that batch on the same device, and rank 0 says so. A model
    without a config: the line says the plan had no activations to count."""
    code, out = run_with_llama(
        configs()["llama"], scratch,
        "import os, yaml\n"
        "llama.gradient_checkpointing_enable()\n"
        f"cfg = {{'train_micro_batch_size_per_gpu': {BATCH}, 'bf16': {{'enabled': True}},\n"
        "       'zero_optimization': {'stage': 3, 'offload_optimizer': {'device': 'cpu', 'ratio': 'auto'}},\n"
        "       'optimizer': {'type': 'AdamW', 'params': {'lr': 1e-3}}}\n"
        "ratio = lambda text: yaml.safe_load(text)['zero_optimization']['offload_optimizer']['ratio']\n"
        "e = zeroshard.initialize(model=llama, config=cfg)[0]\n"
        "ram = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')\n"
        f"plan = zeroshard.estimate(llama, cfg, gpu_memory=ram, seq={SEQ}, micro_batch={BATCH})\n"
        "print('RATIOS', json.dumps([ratio(e._engine.config_yaml), ratio(plan['config_yaml'])]))\n"
        "zeroshard.initialize(model=model, config=cfg)\n")
    assert code == 0, out
    engine_ratio, estimated_ratio = printed(out, "RATIOS")
    assert engine_ratio == estimated_ratio
    assert (f"zeroshard: zero_optimization.offload_optimizer.ratio: auto planned with the "
            f"activations of micro-batches of {BATCH} x {SEQ} tokens "
            "(model.config.max_position_embeddings, layers recomputed in backward)") in out, out
    assert "zeroshard: zero_optimization.offload_optimizer.ratio: auto planned without " \
           "activations (no model shape to count them from" in out, out
    assert out.count("ratio: auto planned") == 2, out
