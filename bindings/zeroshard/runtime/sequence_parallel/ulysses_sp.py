"""deepspeed.runtime.sequence_parallel.ulysses_sp: ALST's Hugging Face path, Ulysses around
transformers' attention (UlyssesSPAttentionHF) and the batches sliced along the sequence
(UlyssesSPDataLoaderAdapter), and its tiled MLP and logits-with-loss (TiledMLP,
TiledFusedLogitsLoss). Its generic sequence_tiled_compute is refused by name
(_common/refusals.py)."""
from ..._common import refusals as _refusals
from ..._sequence.sequence_batches import UlyssesSPDataLoaderAdapter  # noqa: F401
from ..._sequence.tiled_compute import TiledFusedLogitsLoss, TiledMLP  # noqa: F401
from ..._sequence.ulysses_hf import UlyssesSPAttentionHF  # noqa: F401

__getattr__ = _refusals.attribute_refuser(__name__)
