"""The bytes this rank puts into torch.distributed's collectives of the names given while
the context is entered (their input: a rank's own part included), e.g. the all-to-alls of
the experts' and sequence-parallel exchanges, and the functional collectives torch's ring
attention rotates keys and values with; the engine's own collectives go through c10d in C++
and are not seen here."""
import torch.distributed
import torch.distributed._functional_collectives as funcol

# name: (module, the tensor sent: by keyword, else the argument at that place)
_SENT = {"all_to_all_single": (torch.distributed, "input", 1),
         "all_gather": (torch.distributed, "tensor", 1),
         "all_gather_tensor": (funcol, "self", 0), "permute_tensor": (funcol, "self", 0)}


class Counted:
    def __init__(self, *names):
        self.names, self.bytes, self.real = names, 0, {}

    def __enter__(self):
        for name in self.names:
            module, key, place = _SENT[name]
            real = self.real[name] = getattr(module, name)

            def counted(*args, _real=real, _key=key, _place=place, **kwargs):
                sent = kwargs[_key] if _key in kwargs else args[_place]
                self.bytes += sent.numel() * sent.element_size()
                return _real(*args, **kwargs)
            setattr(module, name, counted)
        return self

    def __exit__(self, *exc):
        for name, real in self.real.items():
            setattr(_SENT[name][0], name, real)
