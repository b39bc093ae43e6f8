// zeroshard-estimate --help: every flag the parser in EstimateArgs.cpp reads, kept apart
// from it so the parser's file holds parsing.
#include "tools/estimate/EstimateArgs.h"

namespace zeroshard::estimate {

const char* usage_text() {
  return R"(usage: zeroshard-estimate (--hf-config config.json | --params N [shape]) [options]
Tells, before launch, how many bytes each rank needs on device, host and NVMe for
every ZeRO stage and offload choice, which fits, and which to use.

model:
  --hf-config FILE       a Hugging Face config.json (llama, mistral, mixtral, qwen2,
                         gemma, gpt2, gpt_neox, phi)
  --params N             total parameters (7e9 is fine); refine with --layers,
                         --hidden, --heads, --kv-heads, --vocab, --intermediate
hardware (sizes: 80GB = 80e9 bytes, 80GiB = 80 x 2^30):
  --nodes N              nodes (default 1)
  --gpus-per-node N      ranks per node (default 1)
  --sp N                 sequence-parallel ranks (Ulysses; default: the config's
                         sequence_parallel_size, else 1): each keeps 1/N of every
                         sequence's activations, attention's over the whole sequence with
                         1/N of the heads; ZeRO shards over every rank
  --cp N                 context-parallel ranks (torch's ring attention over a mesh's cp
                         dimension, sdpa): each keeps 1/N of every sequence's activations
                         and the ring's merged attention output; --seq a multiple of 2 x N
  --tiled-mlp N          each dense MLP run in N tiles of the rank's tokens (ALST's
                         TiledMLP): it keeps its input alone, backward recomputes a tile
  --tiled-logits N       the logits and loss in N tiles (ALST's TiledFusedLogitsLoss): one
                         tile's logits at a time, the head weight's gradient held from forward
  --ep N                 expert-parallel ranks (a mixture of experts from --hf-config;
                         default: the config's expert_parallel.autoep_size where enabled,
                         else 1): each holds 1/N of each block's experts, sharded over the
                         ranks holding the same ones
  --tp N                 tensor-parallel ranks (inside a node; default: the config's
                         tensor_parallel.autotp_size, else 1): attention and MLP matrices
                         (and an untied head) split across them, ZeRO over the rest
  --pp N                 pipeline stages (default: the config's pipeline.stages, else 1):
                         the blocks split evenly, the embedding on the first stage, the
                         head on the last (a tied one with a copy of the embedding); each
                         stage planned on its own ranks (ranks / pp); needs the model's
                         shape (--hf-config, or --layers/--hidden/--heads without --params)
  --pp-schedule NAME     1f1b (default: stage s holds pp - s micro-batches' activations),
                         gpipe (every micro-batch's: gradient_accumulation_steps), or
                         interleaved1f1b / loopedbfs (torch's schedules of several stages
                         per rank: stage s on rank s % pp; counted along their order)
  --pp-stages-per-rank V stages on each rank under interleaved1f1b and loopedbfs
                         (default 2): the blocks split over pp x V stages
  --gpu-mem SIZE         device memory per rank (default 80GB)
  --cpu-mem SIZE         host RAM per node (default: this machine's)
  --nvme SIZE            free NVMe per node (default: none)
  --headroom F           fraction of device and host memory kept free (default 0.10)
training:
  --seq N                sequence length (default: the model's max positions, else 1)
  --micro-batch N        micro-batch per rank (default: the config's, else 1)
  --bf16 | --fp16 | --fp32   precision (default: the config's, else bf16)
  --activation-checkpointing   the model recomputes every block itself (Hugging Face's
                         gradient checkpointing)
  --ac-mode MODE         the blocks the engine recomputes (activation_checkpointing.mode):
                         none, full, selective (--ac-option op: every block keeps its
                         matmul outputs, the default; N: every Nth block whole), or
                         memory_budget (--memory-budget F, default 0.5: the fewest whole
                         blocks that keep activations within F of none's), or auto (per
                         choice the fewest whole blocks with which it fits; the
                         recommendation keeps everything on the device where recomputing
                         makes that fit)
  --ac-offload DEVICE    the blocks' saved activations kept in host RAM (cpu) or on NVMe
                         (nvme) until backward (activation_checkpointing.offload.device):
                         two blocks' stay on the device; with --ac-mode none, full,
                         selective N or auto
  --max-seq              also the longest sequence (a multiple of --sp) each choice trains
                         within the budget, at this micro-batch and checkpointing (with
                         --ac-mode auto: and the blocks it recomputes there)
  --max-micro-batch      also the largest micro-batch each choice trains within the
                         budget, at this sequence length and checkpointing
  --attn-implementation NAME   as transformers takes it: sdpa (default), flash_attention_2,
                         flash_attention_3, flex_attention, eager (keeps the a*s*s scores)
  --config FILE          a zeroshard/DeepSpeed config: its fixed keys bound the choice
serving (zeroshard.init_inference: every weight frozen, stage 3):
  --inference            plan serving instead of training: weights on the device, in host
                         RAM or on NVMe, the KV cache of --batch sequences of --seq tokens
                         (prompt and generated), the bytes each rank reads per generated
                         token and the tokens/s those reads allow
  --batch N              sequences per rank (default 1)
  --gpu-bw SIZE          device memory bandwidth per second (default 3.35TB)
  --host-bw SIZE         host RAM to one device per second (default 25GB)
  --nvme-bw SIZE         NVMe reads per second, per node (default 6GB)
output:
  --json                 JSON instead of the table
  --emit-config FILE     write the recommended config as YAML
Exit status: 0 when a plan fits, 1 when nothing fits, 2 on bad input.
)";
}

}  // namespace zeroshard::estimate
