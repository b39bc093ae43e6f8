"""The bytes this rank puts into torch.distributed's collectives of the names given while
the context is entered (their input: a rank's own part included), e.g. the all-to-alls of
the experts' and sequence-parallel exchanges; the engine's own collectives go through c10d
in C++ and are not seen here."""
import torch.distributed

_SENT = {"all_to_all_single": "input", "all_gather": "tensor"}


class Counted:
    def __init__(self, *names):
        self.names, self.bytes, self.real = names, 0, {}

    def __enter__(self):
        for name in self.names:
            real = self.real[name] = getattr(torch.distributed, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                key = _SENT[_name]  # the tensor sent: by keyword, else the second argument
                sent = kwargs[key] if key in kwargs else args[1]
                self.bytes += sent.numel() * sent.element_size()
                return _real(*args, **kwargs)
            setattr(torch.distributed, name, counted)
        return self

    def __exit__(self, *exc):
        for name, real in self.real.items():
            setattr(torch.distributed, name, real)
