"""The package's lowest room: what every other part reads and nothing here imports above it.
- launch: the ranks' environment (rank, world, the rendezvous store torchrun or zeroshard's
  launcher set), and torch.distributed joined to it;
- config: a config (YAML, DeepSpeed JSON, a dict) read into the C++ Config, `auto` kept;
- refusals: DeepSpeed's names zeroshard lacks, refused by name with what to use instead;
- nested: the tensors inside nested arguments and outputs.
May import: zeroshard._zeroshard (the C++ extension) only."""
