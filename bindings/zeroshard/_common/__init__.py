"""The package's lowest room: what every other part reads and nothing here imports above it.
- launch: the ranks' environment (rank, world, the rendezvous store torchrun or zeroshard's
  launcher set), and torch.distributed joined to it;
- config: a config (YAML, DeepSpeed JSON, a dict) read into the C++ Config, `auto` kept;
- refusals: DeepSpeed's names zeroshard lacks, refused by name with what to use instead;
- nested: the tensors inside nested arguments and outputs;
- process_groups: groups made in Python with the config's timeout, their failures named;
- expert_groups: the expert-parallel and expert-data-parallel groups (DeepSpeed's layout);
- expert_names: DeepSpeed's MoE layer's expert names and their numbers in the whole layer.
May import: zeroshard._zeroshard (the C++ extension) only."""
