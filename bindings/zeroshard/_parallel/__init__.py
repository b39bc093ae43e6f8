"""The parallel axes besides ZeRO's data parallelism, one module per axis as a model is
split along it, below the engine that trains the result:
- tensor_parallel: Megatron-style column/row splits, AutoTP, the same-input check;
  dtensor: a model the user split with torch's DTensor; hf_tensor_parallel: a Hugging Face
  model's tp_plan;
- pipelining, pipe_module, pipe_topology: pipeline stages (torch.distributed.pipelining's
  shape, DeepSpeed's PipelineModule and its topologies);
- sync_batchnorm: BatchNorm synchronised across the data-parallel ranks;
- param_shards: parameters sharded while a model is built (zero.Init).
Long sequences (sequence and context parallelism) are the next room, _sequence; experts
split over ranks (mixtures of experts) the one after, _experts.
May import: _common, _activations and the C++ extension."""
