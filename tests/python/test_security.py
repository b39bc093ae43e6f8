"""What zeroshard touches on the machine: the rendezvous store listens only on the
address it is given; checkpoint folders are private (0700, files 0600); a checkpoint's
client_state must be plain data, so loading one never runs code from it."""
import json
import os
import stat
import subprocess
import sys

import pytest

from conftest import free_port, rank_env

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
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("security")
    out = str(d / "run")
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
