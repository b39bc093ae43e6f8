"""One rank of a Hugging Face test: a transformers model built from a small config with
random weights (nothing downloaded), trained the way a Hugging Face script trains it,
`model(input_ids=..., labels=...).loss`, with torch DDP + AdamW (mode ddp) or zeroshard
(mode zs, a config given as JSON); writes this rank's per-step losses to OUT.rankN.json.
usage: hf_worker.py ddp|zs MODEL STEPS OUT [CONFIG_JSON]
MODEL: llama, gpt2 (head tied to the token embedding), mixtral (a router sends each token
to 2 of 4 experts, so an expert may see no token of a step on one rank and some on another).
With ZS_SAVE_PRETRAINED=DIR a zeroshard run ends with engine.save_pretrained(DIR)
(max_shard_size=ZS_MAX_SHARD_SIZE when set) and writes the parameters it holds
(engine.state_dict()) to OUT.rank0.pt for the test to compare with what from_pretrained
loads; with ZS_CKPT_DIR=DIR it ends with engine.save_checkpoint(DIR)."""
import json
import os
import sys

import torch
import torch.distributed as dist
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
VOCAB = 96  # > models.VOCAB: every token of models.batch is in range

SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
IMAGE_TOKEN, IMAGE_TOKENS = VOCAB - 1, 4  # llava: 8x8 images in 4x4 patches
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, tie_word_embeddings=False),
    "gpt2": lambda: transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                            n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                            attn_pdrop=0.0, tie_word_embeddings=True),
    "mixtral": lambda: transformers.MixtralConfig(**SMALL, num_local_experts=4,
                                                  num_experts_per_tok=2, tie_word_embeddings=False),
    # An encoder-decoder: two stacks, the shared embedding tied to the head.
    "t5": lambda: transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                        num_layers=2, num_decoder_layers=2, num_heads=4,
                                        dropout_rate=0.0, tie_word_embeddings=True,
                                        decoder_start_token_id=0),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, head_dim=8, tie_word_embeddings=True),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        **SMALL, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        tie_word_embeddings=False),
    # A vision tower (CLIP) and a language model (Llama) joined by a projector.
    "llava": lambda: transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            image_size=8, patch_size=4, projection_dim=16),
        text_config=transformers.LlamaConfig(**SMALL, tie_word_embeddings=False),
        image_token_index=IMAGE_TOKEN, vision_feature_layer=-1,
        vision_feature_select_strategy="default", image_seq_length=IMAGE_TOKENS),
}
CLASSES = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "mixtral": "MixtralForCausalLM",
           "t5": "T5ForConditionalGeneration", "gemma2": "Gemma2ForCausalLM",
           "qwen3_moe": "Qwen3MoeForCausalLM", "llava": "LlavaForConditionalGeneration"}


def make(name, from_config=False):
    """The model, seed 1234; from_config: built as run_clm.py builds one from scratch
    (AutoModelForCausalLM.from_config), which transformers builds under a ZeRO-3 config's
    zero.Init when TrainingArguments holds one."""
    torch.manual_seed(1234)
    config = CONFIGS[name]()
    config._attn_implementation = "eager"  # the same kernels in both modes
    if from_config:
        return transformers.AutoModelForCausalLM.from_config(config)
    return getattr(transformers, CLASSES[name])(config)


def inputs(name, step, rank, world):
    """The model's keyword inputs for rank `rank`'s slice of step `step`'s global batch: a
    causal LM or T5 learns its tokens; llava reads an image before them (its tokens not
    learned), the image made from the same seed as the tokens."""
    tokens = models.batch(step, rank, world)
    if name != "llava":
        return {"input_ids": tokens, "labels": tokens}
    g = torch.Generator().manual_seed(2000 + step)
    images = torch.randn(models.GLOBAL_ROWS, 3, 8, 8, generator=g)
    rows = models.GLOBAL_ROWS // world
    images = images[rank * rows:(rank + 1) * rows]
    image = torch.full((tokens.shape[0], IMAGE_TOKENS), IMAGE_TOKEN)
    ids = torch.cat([image, tokens], dim=1)
    labels = torch.cat([torch.full_like(image, -100), tokens], dim=1)
    return {"input_ids": ids, "pixel_values": images, "labels": labels}


def main():
    mode, name, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model = make(name)
    model.train()
    losses = []
    if mode == "ddp":
        dist.init_process_group("gloo")
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        for step in range(steps):
            opt.zero_grad(set_to_none=False)
            tokens = models.batch(step, rank, world)
            loss = ddp(input_ids=tokens, labels=tokens).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            losses.append(loss.item())
    else:
        import zeroshard
        engine, _, _, _ = zeroshard.initialize(model=model, config=json.loads(sys.argv[5]))
        for step in range(steps):
            tokens = models.batch(step, rank, world)
            loss = engine(input_ids=tokens, labels=tokens).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        if os.environ.get("ZS_CKPT_DIR"):
            engine.save_checkpoint(os.environ["ZS_CKPT_DIR"])
        if os.environ.get("ZS_SAVE_PRETRAINED"):
            shard = {"max_shard_size": os.environ["ZS_MAX_SHARD_SIZE"]} \
                if os.environ.get("ZS_MAX_SHARD_SIZE") else {}
            engine.save_pretrained(os.environ["ZS_SAVE_PRETRAINED"], **shard)
            held = engine.state_dict()
            if rank == 0:
                torch.save(held, f"{out}.rank0.pt")
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
