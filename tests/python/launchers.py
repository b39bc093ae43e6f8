"""The launchers users start ranks with, run for real on namespace hosts (netns.Hosts):
Open MPI's mpirun, started on the first host, reaching the others through an rsh agent
that logs into a host's namespace as ssh would log into a node; a Slurm cluster on
this machine (munged, slurmctld on the first host, one slurmd per host) that srun runs
jobs on; and an ssh server on each host (key login) that the `zeroshard` command logs
into with a hostfile, as DeepSpeed's launcher does. Nothing sets a rank variable by hand: what the ranks know, the launchers told them.
"""
import contextlib
import os
import shutil
import subprocess
import time

COMMANDS = ["mpirun", "srun", "sinfo", "slurmctld", "slurmd", "munged", "nsenter", "unshare",
            "sshd", "ssh", "ssh-keygen"]

# Open MPI's rsh agent: `agent HOST COMMAND...` runs COMMAND on HOST, as ssh would (through a
# shell: Open MPI sends shell words). Host names are namespace names (netns.Hosts).
AGENT = """#!/bin/sh
host=$1; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host && $*"
"""

# A launcher-started rank must find everything in what the launcher set.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")


def unavailable():
    """None where mpirun and Slurm's daemons are installed, else which are missing."""
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.update(extra)
    return env


def mpirun(hosts, per_host, scratch):
    """The command prefix that starts len(hosts.names) x per_host ranks with mpirun,
    itself running on the first host."""
    agent = os.path.join(scratch, "rsh-agent")
    with open(agent, "w") as f:
        f.write(AGENT)
    os.chmod(agent, 0o755)
    layout = ",".join(f"{name}:{per_host}" for name in hosts.names)
    return hosts.login(0) + [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "-np",
        str(per_host * len(hosts.names)), "--host", layout, "--mca", "plm_rsh_agent", agent]


def _slurm_conf(hosts, cpus, d):
    nodes = "".join(f"NodeName={n} NodeAddr={a} CPUs={cpus} State=UNKNOWN\n"
                    for n, a in zip(hosts.names, hosts.addresses))
    # No cgroups, accounting or mail: a test cluster; linuxproc tracks a step's processes.
    return f"""ClusterName=zs
SlurmctldHost={hosts.names[0]}({hosts.addresses[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
{nodes}PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""


def _start_munge(d):
    key = os.path.join(d, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    # --force: munged refuses a key and socket under a world-writable /tmp otherwise.
    subprocess.run(["munged", "--force", f"--socket={d}/munge.socket", f"--key-file={key}",
                    f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log",
                    f"--seed-file={d}/munged.seed"], check=True, capture_output=True)


def _wait_idle(hosts, env, d, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(hosts.login(0) + ["sinfo", "-h", "-N", "-o", "%t"], env=env,
                           capture_output=True, text=True)
        states = r.stdout.split()
        if len(states) == len(hosts.names) and all(s == "idle" for s in states):
            return
        time.sleep(0.5)
    logs = "".join(open(os.path.join(d, f)).read()[-1500:] for f in sorted(os.listdir(d))
                   if f.endswith(".log"))
    raise RuntimeError(f"Slurm's nodes not idle in {timeout} s: {r.stdout} {r.stderr}\n{logs}")


@contextlib.contextmanager
def slurm(hosts, cpus, scratch):
    """A Slurm cluster of `hosts`, each with `cpus` CPUs; yields (srun prefix, environment)."""
    d = os.path.join(scratch, "slurm")
    os.makedirs(os.path.join(d, "state"))
    for name in hosts.names:
        os.makedirs(os.path.join(d, f"spool-{name}"))
    conf = os.path.join(d, "slurm.conf")
    with open(conf, "w") as f:
        f.write(_slurm_conf(hosts, cpus, d))
    with open(os.path.join(d, "cgroup.conf"), "w") as f:
        f.write("CgroupPlugin=autodetect\n")
    env = clean_env(SLURM_CONF=conf)
    daemons = []
    _start_munge(d)
    try:
        daemons.append(subprocess.Popen(hosts.daemon_login(0) + ["slurmctld", "-D", "-i", "-f",
                                                                 conf], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for i, name in enumerate(hosts.names):
            daemons.append(subprocess.Popen(
                hosts.daemon_login(i) + ["slurmd", "-D", "-f", conf, "-N", name], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_idle(hosts, env, d)
        yield hosts.login(0) + ["srun", "--kill-on-bad-exit=1"], env
    finally:
        for p in daemons:
            p.terminate()
        for p in daemons:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["munged", "--stop", f"--socket={d}/munge.socket"], capture_output=True)


@contextlib.contextmanager
def ssh(hosts, scratch):
    """An ssh server on each host (root logs in with a key made here); yields the
    environment for the `zeroshard` command and the hostfile naming the hosts."""
    d = os.path.join(scratch, "ssh")
    os.makedirs(d)
    for key in ("id", "host_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        os.path.join(d, key)], check=True)
    shutil.copy(os.path.join(d, "id.pub"), os.path.join(d, "authorized_keys"))
    with open(os.path.join(d, "config"), "w") as f:
        f.write(f"Host *\n  IdentityFile {d}/id\n  StrictHostKeyChecking no\n"
                "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    daemons = []
    try:
        for i, addr in enumerate(hosts.addresses):
            conf = os.path.join(d, f"sshd-{i}.conf")
            with open(conf, "w") as f:
                f.write(f"ListenAddress {addr}\nHostKey {d}/host_key\n"
                        f"AuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd-{i}.pid\n"
                        "StrictModes no\nUsePAM no\nPasswordAuthentication no\n"
                        "PermitRootLogin prohibit-password\n")
            daemons.append(subprocess.Popen(hosts.daemon_login(i) + [
                shutil.which("sshd"), "-D", "-e", "-f", conf], stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(d, f"sshd-{i}.log"), "w")))
        hostfile = os.path.join(d, "hostfile")
        with open(hostfile, "w") as f:
            f.write("".join(f"{name} slots=2\n" for name in hosts.names))
        env = clean_env(PDSH_SSH_ARGS_APPEND=f"-F {d}/config")
        _wait_listening(hosts, env)
        yield env, hostfile
    finally:
        for p in daemons:
            p.terminate()
            p.wait(timeout=20)


def _wait_listening(hosts, env, timeout=30):
    deadline = time.monotonic() + timeout
    for i, name in enumerate(hosts.names):
        while True:
            r = subprocess.run(hosts.login(0) + ["ssh", "-o", "BatchMode=yes"] +
                               env["PDSH_SSH_ARGS_APPEND"].split() + [name, "true"],
                               env=env, capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no ssh login to {name} in {timeout} s: {r.stderr}")
            time.sleep(0.2)
