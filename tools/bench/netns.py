"""Hosts that are really separate, on this machine: one network namespace per host,
each with its own eth0 on a bridge in a "switch" namespace, and the link between a host
and the switch limited by tbf both ways (none inside a host: its ranks talk over its own
loopback). Ranks run inside their host's namespace, so what crosses between hosts is
counted by that host's eth0 and can only travel over those addresses. Each host's name is
its namespace's, and resolves on every host (iproute2's /etc/netns/NAME/hosts), as a
cluster's DNS would make it: launchers (mpirun, Slurm) address hosts by name."""
import contextlib
import json
import os
import re
import shutil
import subprocess

SUBNET = "10.213.0"


def _run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def unavailable():
    """None where namespaces, veth, a bridge and tbf can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"zsprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        try:
            _run("ip", "-n", probe, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
            _run("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "tbf",
                 "rate", "1gbit", "burst", "256kb", "latency", "50ms")
        finally:
            _run("ip", "netns", "del", probe)
    except (OSError, RuntimeError) as e:
        return f"network namespaces, veth, bridge or tbf not allowed here: {e}"
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


ETC = "/etc/netns"  # `ip netns exec NAME` binds ETC/NAME/hosts over /etc/hosts


def _remove_orphans():
    """Namespaces left by a test run that was killed before it could clean up: their
    addresses would collide with this run's on the same subnet."""
    names = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.split()]
    names += os.listdir(ETC) if os.path.isdir(ETC) else []
    for name in set(names):
        m = re.fullmatch(r"zs(\d+)(sw|h\d+)", name)
        if m and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(os.path.join(ETC, name), ignore_errors=True)


class Hosts:
    def __init__(self, count, rate):
        tag = f"zs{os.getpid() % 100000}"
        self.switch = f"{tag}sw"
        self.names = [f"{tag}h{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self.rate = rate

    def create(self):
        _remove_orphans()
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.names, self.addresses)):
            port = f"{self.switch}p{i}"[-15:]
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            inside, outside = f"{ns}a", f"{ns}b"  # made in this namespace, then moved
            _run("ip", "link", "add", inside, "type", "veth", "peer", "name", outside)
            _run("ip", "link", "set", inside, "netns", ns)
            _run("ip", "-n", ns, "link", "set", inside, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "link", "set", outside, "netns", self.switch)
            _run("ip", "-n", self.switch, "link", "set", outside, "name", port)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            for where, dev in ((ns, "eth0"), (self.switch, port)):  # out of and into the host
                _run("ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev, "root",
                     "tbf", "rate", self.rate, "burst", "256kb", "latency", "50ms")
        table = "127.0.0.1 localhost\n" + "".join(
            f"{a} {n}\n" for a, n in zip(self.addresses, self.names))
        for ns in self.names:
            os.makedirs(os.path.join(ETC, ns), exist_ok=True)
            with open(self.hosts_file(ns), "w") as f:
                f.write(table)

    def destroy(self):
        for ns in self.names + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(os.path.join(ETC, ns), ignore_errors=True)

    @staticmethod
    def hosts_file(name):
        return os.path.join(ETC, name, "hosts")

    def login(self, host):
        """A command prefix that runs on `host` as if logged in there: its network, its
        name (hostname), its /etc/hosts."""
        ns = self.names[host]
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', ns]

    def daemon_login(self, host):
        """login() for daemons that need the machine's /sys (Slurm's slurmd reads its
        cgroups there; `ip netns exec` mounts a /sys of the namespace's own)."""
        ns = self.names[host]
        return ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "--mount", "sh", "-c",
                'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"', ns,
                self.hosts_file(ns)]

    def link_bytes(self, host):
        """(sent, received) bytes on host's link to the others."""
        stats = json.loads(_run("ip", "-n", self.names[host], "-s", "-j", "link", "show",
                                "eth0"))[0]["stats64"]
        return stats["tx"]["bytes"], stats["rx"]["bytes"]

    def take_away(self, host):
        """The host's link goes down, as a host that lost its network or power."""
        _run("ip", "-n", self.names[host], "link", "set", "eth0", "down")

    def launch(self, ranks_per_host):
        """For conftest.run_ranks: rank r runs on host r // ranks_per_host, with the
        rendezvous on the first host's address."""
        def wrap(rank):
            host = rank // ranks_per_host
            env = {"MASTER_ADDR": self.addresses[0], "LOCAL_RANK": str(rank % ranks_per_host),
                   "LOCAL_WORLD_SIZE": str(ranks_per_host)}
            return ["ip", "netns", "exec", self.names[host]], env
        return wrap


@contextlib.contextmanager
def hosts(count=2, rate="1gbit"):
    h = Hosts(count, rate)
    try:
        h.create()
        yield h
    finally:
        h.destroy()
