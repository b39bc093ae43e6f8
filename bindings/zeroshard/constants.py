"""deepspeed.constants: the launcher's names."""
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
CROSS_RANK, CROSS_SIZE = "CROSS_RANK", "CROSS_SIZE"  # a node's index and the node count
