"""activation_checkpointing.offload: what the model's blocks save for backward, kept in host
RAM (device cpu) or on NVMe (device nvme) from the block's forward to its backward.

policy.py runs each block's forward inside block(), where autograd's saved-tensor hooks
hand every saved tensor here: its storage's bytes go to a host block of the engine's
ActivationStore (offload/ActivationStore.h: counted in the ledger on the host tier, and
with NVMe written on to the nvme tier), and the saved tensor becomes a handle. In backward
the first handle of a block unpacked brings that storage back and starts bringing the block
before it (NVMe reads, and on a GPU the copies in on a side stream), so about two blocks'
are on the device at once. With a recomputed block (mode full or selective N) what it saves
is its input, which torch's checkpoint saves through the same hooks.

Left where they are: parameters and buffers (of the block, leaves that require grad, and
views of them), tensor subclasses, and storages under _SMALL bytes. A storage saved by
several ops of one forward (a block's input read by its three projections, the rotary
tables every block reads) is copied once while it is alive (a weak reference to the storage
says so: a freed storage's address can be reused, so an address alone never identifies one)
and unchanged (its version counter). On the CPU machine the copies are host to host, the
same path."""
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_SMALL = 1024  # bytes


class _Block:
    """One forward of one block: the storages it copied out first (weakly: a handle, held by
    autograd, keeps each alive) and the block that ran before it."""
    __slots__ = ("stored", "previous", "fetched", "originals", "event")

    def __init__(self, previous):
        self.stored, self.previous, self.fetched = [], previous, False
        self.originals, self.event = [], None


class _Stored:
    """One storage's bytes off the device."""
    __slots__ = ("offload", "block", "nbytes", "device", "version", "host", "nvme", "handles",
                 "unpacked", "on_device", "ready", "__weakref__")

    def __init__(self, offload, block, storage, tensor):
        self.offload, self.block, self.nbytes = offload, block, storage.nbytes()
        self.device, self.version = tensor.device, tensor._version
        self.handles, self.unpacked, self.on_device, self.ready = 0, 0, None, None
        self.host = offload.store.host(self.nbytes)
        self.nvme = None
        source = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
        stream = offload.copy_stream(self.device)
        if stream is None:
            self.host.tensor().copy_(source)
            if offload.store.has_nvme:
                self.nvme, self.host = offload.store.write(self.host), None
        else:  # the copy waits for the op that made it, and leaves the device's stream
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self.host.tensor().copy_(source, non_blocking=True)
            block.originals.append(storage)  # until the copy has run
        block.stored.append(weakref.ref(self))

    def written(self):
        """After the copy out has run: on to NVMe, or, written, the host copy released."""
        if self.nvme is not None:
            self.nvme.written()
        elif self.offload.store.has_nvme and self.host is not None:
            self.nvme, self.host = self.offload.store.write(self.host), None

    def fetch(self):
        """Starts bringing the bytes back: the NVMe read, or on a GPU the copy in."""
        if self.on_device is not None:
            return
        if self.nvme is not None:
            self.nvme.fetch()  # bring() copies in once it is read
            return
        stream = self.offload.copy_stream(self.device)
        if stream is None:
            return
        with torch.cuda.stream(stream):  # the host block stays held by this _Stored
            self.on_device = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self.on_device.copy_(self.host.tensor(), non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record(stream)
        self.on_device.record_stream(torch.cuda.current_stream(self.device))

    def bring(self):
        """The bytes on the device, as a uint8 tensor whose storage the saved tensor views."""
        if self.on_device is None:
            host = self.nvme.take().tensor() if self.nvme is not None else self.host.tensor()
            self.on_device = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
            self.on_device.copy_(host)
        elif self.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready)
            self.ready = None
        return self.on_device


class _Handle:
    __slots__ = ("stored", "offset", "size", "stride", "dtype")

    def __init__(self, stored, tensor):
        self.stored, self.dtype = stored, tensor.dtype
        self.offset, self.size = tensor.storage_offset(), tensor.size()
        self.stride = tensor.stride()


class Offload:
    """The saved-tensor hooks of the engine's blocks; `store` the engine's ActivationStore."""

    def __init__(self, store):
        self.store = store
        self.current = None  # the _Block whose forward runs
        self.last = None  # the _Block that ran last in this forward
        self.seen = {}  # storage address -> (weakref to its _Stored, StorageWeakRef)
        self.pending = []  # blocks whose copies out may still run
        self.streams = {}

    def copy_stream(self, device):
        """The side stream of a GPU's copies; None on the CPU (copies run in line)."""
        if device.type != "cuda":
            return None
        if device not in self.streams:
            self.streams[device] = torch.cuda.Stream(device)
        return self.streams[device]

    def begin_forward(self):
        """A forward of the model begins: its blocks chain afresh."""
        self.settle(keep=0)
        self.seen.clear()
        self.last = None

    def block(self, module):
        return _BlockForward(self, module)

    def settle(self, keep):
        """Blocks' copies out that have run, but the last `keep` blocks': their originals
        released and, with NVMe, written."""
        while len(self.pending) > keep:
            done = self.pending.pop(0)
            if done.event is not None:
                done.event.synchronize()
            done.originals.clear()
            for ref in done.stored:
                stored = ref()
                if stored is not None:
                    stored.written()

    def pack(self, module, tensor):
        if not self._offloadable(module, tensor):
            return tensor
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        stored = None
        if address in self.seen:
            ref, alive = self.seen[address]
            stored = ref()
            if stored is None or alive.expired() or stored.version != tensor._version:
                stored = None
        if stored is None:
            stored = _Stored(self, self.current, storage, tensor)
            self.seen[address] = (weakref.ref(stored), StorageWeakRef(storage))
        stored.handles += 1
        return _Handle(stored, tensor)

    def unpack(self, handle):
        if isinstance(handle, torch.Tensor):
            return handle
        if self.pending:  # backward begins: the last blocks' copies out end (and are written)
            self.settle(keep=0)
        stored = handle.stored
        block = stored.block
        if not block.fetched:  # this block's backward begins: the one before it comes back
            block.fetched = True
            if block.previous is not None:
                for ref in block.previous.stored:
                    ahead = ref()
                    if ahead is not None:
                        ahead.fetch()
        data = stored.bring()
        out = torch.empty(0, dtype=handle.dtype, device=stored.device)
        out.set_(data.untyped_storage(), handle.offset, handle.size, handle.stride)
        stored.unpacked += 1
        if stored.unpacked >= stored.handles:
            stored.on_device = None  # `out` holds it while autograd uses it
        return out

    def _offloadable(self, module, tensor):
        if type(tensor) is not torch.Tensor or tensor.layout != torch.strided:
            return False
        if isinstance(tensor, torch.nn.Parameter) or (tensor.is_leaf and tensor.requires_grad):
            return False
        storage = tensor.untyped_storage()
        if storage.nbytes() < _SMALL:
            return False
        address = storage.data_ptr()
        held = (*module.parameters(), *module.buffers())
        return all(p.untyped_storage().data_ptr() != address for p in held)


class _BlockForward:
    """The hooks around one block's forward; on leaving, its copies out are left to finish
    while the next block runs."""

    def __init__(self, offload, module):
        self.offload, self.module = offload, module
        self.hooks = torch.autograd.graph.saved_tensors_hooks(
            lambda t: offload.pack(module, t), offload.unpack)

    def __enter__(self):
        offload = self.offload
        self.outer = offload.current
        offload.current = _Block(offload.last if self.outer is None else self.outer)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)
        offload = self.offload
        done, offload.current = offload.current, self.outer
        if self.outer is not None:  # a block inside a block: the outer one holds its storages
            self.outer.stored += done.stored
            self.outer.originals += done.originals
            return False
        offload.last = done
        if done.originals:
            done.event = torch.cuda.Event()
            done.event.record(offload.copy_stream(done.originals[0].device))
        offload.pending.append(done)
        offload.settle(keep=1)
        return False
