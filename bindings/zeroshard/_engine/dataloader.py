"""deepspeed.runtime.dataloader's RepeatingLoader and DeepSpeedDataLoader, the loader an
engine builds over initialize's training_data (engine.deepspeed_io).

DeepSpeed's loader makes a new torch DataLoader at each pass and starts it at the pass's
first batch, which is when torch's DataLoader draws one number from the global random
generator (its workers' base seed). That draw moves every later dropout mask, so it is kept
here at the same moment; a pipeline stage reads a step's micro-batches before their
forwards, and defers each pass's draw to the forward of the micro-batch that began it
(deferred_draws)."""
import contextlib
import threading

import torch

from .. import _zeroshard

_local = threading.local()  # .deferred: this thread's open deferred_draws() lists


def _deferred():
    if not hasattr(_local, "deferred"):
        _local.deferred = []
    return _local.deferred


def draw_as_a_dataloader_does():
    """One number from torch's global generator, as torch.utils.data.DataLoader draws when
    an iteration over it begins."""
    torch.empty((), dtype=torch.int64).random_()


@contextlib.contextmanager
def deferred_draws():
    """Inside, a DeepSpeedDataLoader pass that this thread begins draws nothing; the yielded
    list gets one entry per pass begun, for the caller to draw (draw_as_a_dataloader_does)
    when the batch is used."""
    begun, stack = [], _deferred()
    stack.append(begun)
    try:
        yield begun
    finally:
        stack.pop()


class RepeatingLoader:
    """deepspeed.utils.RepeatingLoader: iterates `loader` again from its start when it ends."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


class DeepSpeedDataLoader:
    """Micro-batches of `dataset` in `data_sampler`'s order (DeepSpeed's default: a
    DistributedSampler over the data-parallel ranks, shuffled with seed 0, the same order
    every pass unless the script calls data_sampler.set_epoch); the last partial batch kept
    unless drop_last. Loads in the calling process (DeepSpeed starts two worker processes;
    a dataset whose items draw random numbers gets other ones here)."""

    def __init__(self, dataset, batch_size, data_sampler, collate_fn=None, drop_last=False,
                 pin_memory=False):
        self.dataset, self.batch_size, self.data_sampler = dataset, batch_size, data_sampler
        self.collate_fn, self.dataloader_drop_last = collate_fn, drop_last
        # Its own generator: the global draw is made here, when the pass really begins.
        self.dataloader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, sampler=data_sampler, collate_fn=collate_fn,
            drop_last=drop_last, pin_memory=pin_memory, generator=torch.Generator())
        self.len = len(self.dataloader)
        self.data = None

    def __len__(self):
        return self.len

    def __iter__(self):
        self.data = None  # a new pass, begun at its first batch
        return self

    def __next__(self):
        if self.data is None:
            stack = _deferred()
            if stack:
                stack[-1].append(self)
            else:
                draw_as_a_dataloader_does()
            self.data = iter(self.dataloader)
        return next(self.data)


ROUTE_TRAIN, ROUTE_EVAL, ROUTE_PREDICT, ROUTE_ENCODE = "train", "eval", "predict", "encode"


def engine_loader(engine, dataset, batch_size=None, route=ROUTE_TRAIN, pin_memory=True,
                  data_sampler=None, collate_fn=None, num_local_io_workers=None):
    """engine.deepspeed_io: a DeepSpeedDataLoader over this rank's share of `dataset`:
    micro-batches of train_micro_batch_size_per_gpu, a DistributedSampler over the
    data-parallel ranks (shuffled for training, in order for eval and predict) unless
    data_sampler is given."""
    if not isinstance(dataset, torch.utils.data.Dataset):
        raise _zeroshard.Error(f"deepspeed_io: dataset is a {type(dataset).__name__}; "
                               "allowed: a torch.utils.data.Dataset")
    if isinstance(dataset, torch.utils.data.IterableDataset) and data_sampler is None:
        raise _zeroshard.Error("deepspeed_io: an IterableDataset has no indices to share "
                               "among the data-parallel ranks; allowed: a map-style Dataset, "
                               "or data_sampler=")
    if num_local_io_workers not in (None, 0):
        raise _zeroshard.Error(f"deepspeed_io: num_local_io_workers={num_local_io_workers}: "
                               "the loader reads in the calling process; allowed: None or 0")
    routes = (ROUTE_TRAIN, ROUTE_EVAL, ROUTE_PREDICT, ROUTE_ENCODE)
    if route not in routes:
        raise _zeroshard.Error(f"deepspeed_io: route={route!r}; allowed: {', '.join(routes)}")
    if data_sampler is None:
        data_sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=engine.dp_world_size, rank=engine.data_parallel_rank,
            shuffle=route not in (ROUTE_EVAL, ROUTE_PREDICT))
    return DeepSpeedDataLoader(
        dataset, batch_size or engine.train_micro_batch_size_per_gpu(), data_sampler,
        collate_fn=collate_fn if collate_fn is not None else getattr(engine, "collate_fn", None),
        drop_last=engine._engine.dataloader_drop_last,
        pin_memory=pin_memory and torch.cuda.is_available() and engine.device.type == "cuda")


class LoaderMethods:
    """The engine's deepspeed_io (ZeroShardEngine takes it from here)."""

    def deepspeed_io(self, dataset, batch_size=None, route=ROUTE_TRAIN, pin_memory=True,
                     data_sampler=None, collate_fn=None, num_local_io_workers=None):
        """DeepSpeed's loader over this rank's share of `dataset` (engine_loader)."""
        return engine_loader(self, dataset, batch_size, route, pin_memory, data_sampler,
                             collate_fn, num_local_io_workers)
