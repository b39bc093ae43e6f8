"""DeepSpeed's UlyssesSPDataLoaderAdapter (zeroshard.runtime.sequence_parallel.ulysses_sp):
the batches of a sequence-parallel group, sliced along the sequence.

Each rank of the group draws its own batch from its data loader, as a data-parallel rank
would; the group then trains on those batches one after another, every rank holding its
slice of each: one draw gives p micro-batches (rank j's batch first on every rank at
position j), so p iterations of the adapter are one iteration of the loaders beneath it.

Labels are shifted before slicing (shift_labels: the next token's id, -100 past the end),
since a slice's last token is predicted by the next slice's first; position ids are the
whole sequence's (made 0..s-1 where the batch has none), so that the rotary embedding and
the whole-sequence attention of each slice see the tokens' true positions."""
from collections import deque

import torch
import torch.distributed as dist

from .. import _zeroshard
from .._common import process_groups


def _error(message):
    return _zeroshard.Error(f"UlyssesSPDataLoaderAdapter: {message}")


class UlyssesSPDataLoaderAdapter:
    """DeepSpeed's UlyssesSPDataLoaderAdapter(dl, sp_rank, sp_group, sp_world_size, device):
    iterates dicts of [batch, seq, ...] tensors (input_ids, and labels, position_ids where
    given) as this rank's slices; other values go to every rank as they are."""

    def __init__(self, dl, sp_rank, sp_group, sp_world_size, device):
        self.dl, self.sp_rank, self.sp_group = dl, sp_rank, sp_group
        self.sp_world_size, self.device = sp_world_size, device
        self.iter = iter(dl)
        self.micro_batches = deque()

    def __len__(self):
        return len(self.dl) * self.sp_world_size

    def __iter__(self):
        return self

    def __next__(self):
        if not self.micro_batches:
            self.refill()
        return self.micro_batches.popleft()

    def refill(self):
        try:
            batch = next(self.iter)
        except StopIteration:
            self.iter = iter(self.dl)  # the next epoch starts where this one stopped
            raise
        if not isinstance(batch, dict) or "input_ids" not in batch:
            raise _error(f"a batch of type {type(batch).__name__}"
                         f"{' without input_ids' if isinstance(batch, dict) else ''}; "
                         "allowed: a dict of [batch, seq] tensors with input_ids")
        length = batch["input_ids"].shape[1]
        if "position_ids" not in batch:
            batch["position_ids"] = torch.arange(length).expand_as(batch["input_ids"])
        for key, value in batch.items():
            if torch.is_tensor(value) and (value.dim() < 2 or value.shape[1] != length):
                raise _error(f"{key} of shape {list(value.shape)}, input_ids of "
                             f"{list(batch['input_ids'].shape)}; allowed: tensors whose "
                             f"second dimension is the sequence's ({length})")
        lengths = self._gather_lengths(length)
        gathered = {key: self._gather(value, lengths) for key, value in batch.items()}
        for source in range(self.sp_world_size):
            self.micro_batches.append(
                self._slice({k: v[source] for k, v in gathered.items()}))

    def _gather_lengths(self, length):
        mine = torch.tensor([length], dtype=torch.int64, device=self.device)
        every = [torch.zeros_like(mine) for _ in range(self.sp_world_size)]
        with process_groups.named("the data-loader adapter's length all-gather", self.sp_group):
            dist.all_gather(every, mine, group=self.sp_group)
        return [int(t.item()) for t in every]

    def _gather(self, value, lengths):
        """Every rank's value of this key, in the group's rank order."""
        if not torch.is_tensor(value):
            every = [None] * self.sp_world_size
            dist.all_gather_object(every, value, group=self.sp_group)
            return every
        value = value.to(self.device).contiguous()
        every = [value.new_empty((value.shape[0], n, *value.shape[2:])) for n in lengths]
        with torch.no_grad():
            with process_groups.named("the data-loader adapter's batch all-gather", self.sp_group):
                dist.all_gather(every, value, group=self.sp_group)
        return every

    def _slice(self, batch):
        length = batch["input_ids"].shape[1]
        if length % self.sp_world_size:
            raise _error(f"a sequence of {length} tokens does not split over "
                         f"{self.sp_world_size} ranks; allowed: a length divisible by "
                         f"{self.sp_world_size} (pad the batch)")
        if "labels" in batch:
            labels = batch.pop("labels")
            batch["shift_labels"] = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
        chunk = length // self.sp_world_size
        mine = slice(chunk * self.sp_rank, chunk * (self.sp_rank + 1))
        return {k: v[:, mine].contiguous().cpu() if torch.is_tensor(v) else v
                for k, v in batch.items()}
