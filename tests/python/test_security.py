"""What zeroshard touches on the machine: the rendezvous store listens only on the
address it is given; checkpoint folders are private (0700, files 0600); a checkpoint's
client_state must be plain data, so loading one never runs code from it; a DeepSpeed
checkpoint is read without unpickling anything but tensors, plain values and DeepSpeed's
own few types (bindings/zeroshard/_checkpoint/safe_load.py), so a payload in it never runs, on any
rank. (Lightning's and Fabric's state: tests/python/test_lightning.py.)"""
import json
import os
import stat
import subprocess
import sys

import pytest

import deepspeed_layout
from conftest import Payload, free_port, rank_env, run_snippet

SCRIPT = """
import json, os, sys, torch, zeroshard
m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
engine, *_ = zeroshard.initialize(model=m, config={'zero_optimization': {'stage': 2}})
out = sys.argv[1]
if engine.rank == 0:
    port = int(os.environ['MASTER_PORT'])
    listening = []
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(':')
            if state == '0A' and int(p, 16) == port:
                listening.append(addr)
    json.dump(listening, open(out + '.listen', 'w'))
engine.backward(engine(torch.ones(2, 4)).sum()); engine.step()
engine.save_checkpoint(out + '.ckpt', tag='t', client_state={'step': 1})
try:
    engine.save_checkpoint(out + '.ckpt', tag='u', client_state={'f': open})
except zeroshard.Error as e:
    if engine.rank == 0:
        open(out + '.refused', 'w').write(str(e))
# A DeepSpeed checkpoint whose model-states file carries a payload: refused on every rank.
try:
    engine.load_checkpoint(out + '.ds-payload')
    said = 'loaded'
except zeroshard.Error as e:
    said = str(e)
open(out + f'.payload.rank{engine.rank}', 'w').write(said)
# The same checkpoint without it loads: its parameters are the engine's now.
engine.load_checkpoint(out + '.ds-clean')
with engine.gathered_parameters():
    json.dump({n: p.tolist() for n, p in engine.module.named_parameters()},
              open(out + f'.clean.rank{engine.rank}', 'w'))
"""


def ds_params():
    import torch
    torch.manual_seed(3)
    return [{"0.weight": torch.randn(4, 4), "0.bias": torch.randn(4),
             "1.weight": torch.randn(4, 4), "1.bias": torch.randn(4)}]



@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("security")
    out = str(d / "run")
    deepspeed_layout.stage3(d / "run.ds-payload" / "global_step2", 2, ds_params(), {}, {},
                            extra={"note": Payload(out + ".marker")})
    deepspeed_layout.stage3(d / "run.ds-clean" / "global_step2", 2, ds_params(), {}, {})
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, out], env=rank_env(r, 2, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    for r, p in enumerate(procs):
        log = p.communicate(timeout=120)[0]
        assert p.returncode == 0, f"rank {r}:\n{log[-3000:]}"
    return out


def test_the_store_listens_only_on_its_address(run):
    listening = json.load(open(run + ".listen"))
    assert listening == ["0100007F"], f"listening on {listening} (hex), not only 127.0.0.1"


def test_checkpoint_folders_are_private(run):
    ckpt = run + ".ckpt"
    assert stat.S_IMODE(os.stat(ckpt).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(ckpt, "t")).st_mode) == 0o700
    for name in os.listdir(os.path.join(ckpt, "t")):
        assert stat.S_IMODE(os.stat(os.path.join(ckpt, "t", name)).st_mode) == 0o600, name


def test_client_state_that_is_not_plain_data_is_refused(run):
    message = open(run + ".refused").read()
    assert "client_state must be plain data (JSON)" in message, message
    assert not os.path.exists(os.path.join(run + ".ckpt", "u", "manifest.json"))
    manifest = json.load(open(os.path.join(run + ".ckpt", "t", "manifest.json")))
    assert manifest["client_state"] == {"step": 1}


def test_a_deepspeed_checkpoint_carrying_a_payload_is_refused_on_every_rank(run):
    for rank in range(2):
        said = open(run + f".payload.rank{rank}").read()
        assert said.startswith("DeepSpeed checkpoint file '"), said
        assert "zero_pp_rank_0_mp_rank_00_model_states.pt': holds posix.mkdir; zeroshard does " \
               "not unpickle objects from a file it did not write" in said, said
        assert "trust_checkpoint=True" in said and "add_safe_globals" in said, said
    assert not os.path.exists(run + ".marker"), "the payload ran"
    want = {n: t.tolist() for n, t in ds_params()[0].items()}
    for rank in range(2):
        assert json.load(open(run + f".clean.rank{rank}")) == want


def test_trusting_a_deepspeed_checkpoint_is_a_knowing_step(tmp_path):
    """A type outside the allowlist (a Fraction in DeepSpeed's data-sampler state, which
    the conversion does not carry) is refused by name, and nothing is written; with
    trust_checkpoint=True the file is unpickled whole and converts."""
    import fractions
    deepspeed_layout.stage3(tmp_path / "ds" / "global_step2", 1, ds_params(), {}, {},
                            extra={"data_sampler": {"ratio": fractions.Fraction(1, 3)}})
    convert = ("zeroshard.convert_deepspeed_checkpoint({ds!r}, {out!r}, "
               "trust_checkpoint={trust})\n")
    code, said = run_snippet(convert.format(ds=str(tmp_path / "ds"), out=str(tmp_path / "no"),
                                            trust=False), launched=False)
    assert code != 0 and "holds fractions.Fraction; zeroshard does not unpickle objects" in said, \
        said
    assert not (tmp_path / "no" / "global_step2").exists()  # nothing half-written
    code, said = run_snippet(convert.format(ds=str(tmp_path / "ds"), out=str(tmp_path / "yes"),
                                            trust=True), launched=False)
    assert code == 0, said
    manifest = json.load(open(tmp_path / "yes" / "global_step2" / "manifest.json"))
    assert [p["name"] for p in manifest["groups"][0]["params"]] == list(ds_params()[0])
