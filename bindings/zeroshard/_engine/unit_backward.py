"""Stage 3's module hooks in backward: when a unit's inputs have their gradients, and
when the unit that made a tensor begins its backward (engine/UnitRelease.h says why a
unit's frozen parameters wait for its inputs' gradients)."""
import torch

from .._common.nested import tensors


class GradArrival:
    """What happens when a tensor's gradient is complete, in one hook and in this order:
    the units that read the tensor learn that their inputs' gradients are done (their
    frozen parameters may go), then the unit that made it begins its backward (its
    parameters are gathered). Two hooks would run in registration order, the producer's
    first, and hold two units' parameters at once."""

    def __init__(self):
        self.read_by = []      # callables: a unit's input has its gradient
        self.produced_by = []  # callables: the producing unit's backward begins

    @staticmethod
    def of(t):
        arrival = getattr(t, "_zeroshard_arrival", None)
        if arrival is None:
            arrival = t._zeroshard_arrival = GradArrival()
            t.register_hook(arrival)
        return arrival

    def __call__(self, _grad):
        calls = self.read_by + self.produced_by
        self.read_by, self.produced_by = [], []  # a leaf may come back in the next forward
        for call in calls:
            call()


def report_input_grads(engine, index, args, kwargs):
    """Tells the engine when the gradients of a unit's inputs are all computed: its frozen
    parameters are read until then (engine/UnitRelease.h)."""
    needing = list({id(t): t for t in tensors((args, kwargs)) if t.requires_grad}.values())
    if not needing or not engine.unit_inputs_need_grad(index):
        return
    left = [len(needing)]

    def arrived():
        left[0] -= 1
        if left[0] == 0:
            engine.unit_inputs_done(index)

    for t in needing:
        GradArrival.of(t).read_by.append(arrived)
