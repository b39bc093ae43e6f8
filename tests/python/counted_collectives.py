"""The bytes this rank puts into torch.distributed's collectives of the names given while
the context is entered (their input: a rank's own part included), e.g. the all-to-alls of
the experts' and sequence-parallel exchanges; the engine's own collectives go through c10d
in C++ and are not seen here."""
import torch.distributed


class Counted:
    def __init__(self, *names):
        self.names, self.bytes, self.real = names, 0, {}

    def __enter__(self):
        for name in self.names:
            real = self.real[name] = getattr(torch.distributed, name)

            def counted(first, second, *args, _real=real, _name=name, **kwargs):
                sent = second if _name in ("all_to_all_single", "all_gather") else first
                self.bytes += sent.numel() * sent.element_size()
                return _real(first, second, *args, **kwargs)
            setattr(torch.distributed, name, counted)
        return self

    def __exit__(self, *exc):
        for name, real in self.real.items():
            setattr(torch.distributed, name, real)
