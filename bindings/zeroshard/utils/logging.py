"""deepspeed.utils.logging: the library's logger ("zeroshard", to stderr, INFO) and
log_dist (a message from the given ranks only)."""
import logging
import sys

logger = logging.getLogger("zeroshard")
if not logger.handlers:
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter(
        "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def log_dist(message, ranks=None, level=logging.INFO):
    """Logs `message` on the ranks listed (all with -1 among them; rank 0 when None)."""
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_initialized() else 0
    ranks = [0] if ranks is None else ranks
    if -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}")
