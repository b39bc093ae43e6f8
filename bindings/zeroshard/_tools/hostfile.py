"""DeepSpeed's hostfile and its resource flags, for the `zeroshard` command: which hosts
run ranks and on which device slots.

A hostfile line is `HOSTNAME slots=N` ('#' starts a comment). --include and --exclude
take DeepSpeed's NODE_SPEC[@NODE_SPEC ...], each NODE_SPEC a host and optionally its
slots, `worker-0:0,2@worker-1`; --num_nodes keeps the first hosts and --num_gpus the
first slots of each. The result is {host: [slot, ...]} in the hostfile's order, which
is also the order of the ranks (host 0's slots are ranks 0..n-1)."""
import re


class HostfileError(ValueError):
    """A hostfile or resource flag that cannot be used; the message names it."""


def read(path):
    """{host: slot count} of the hostfile at `path`, in its order."""
    hosts = {}
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise HostfileError(f"--hostfile {path}: {e.strerror}") from None
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        m = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", text)
        if not m or int(m.group(2)) < 1:
            raise HostfileError(f"--hostfile {path}, line {number}: {text!r}; allowed: "
                                "'HOSTNAME slots=N' with N >= 1")
        if m.group(1) in hosts:
            raise HostfileError(f"--hostfile {path}, line {number}: host {m.group(1)!r} is "
                                "listed twice")
        hosts[m.group(1)] = int(m.group(2))
    if not hosts:
        raise HostfileError(f"--hostfile {path} lists no host ('HOSTNAME slots=N' lines)")
    return hosts


def _parse_spec(flag, spec, hosts):
    """{host: [slots] or None (all of them)} of a NODE_SPEC[@NODE_SPEC ...]."""
    chosen = {}
    for part in spec.split("@"):
        host, _, listed = part.partition(":")
        if host not in hosts:
            raise HostfileError(f"{flag} {spec!r}: host {host!r} is not in the hostfile; "
                                f"allowed: {', '.join(hosts)}")
        slots = None
        if listed:
            try:
                slots = [int(s) for s in listed.split(",")]
            except ValueError:
                raise HostfileError(f"{flag} {spec!r}: slots {listed!r} are not numbers "
                                    "('HOST:0,1')") from None
            bad = [s for s in slots if not 0 <= s < hosts[host]]
            if bad:
                raise HostfileError(f"{flag} {spec!r}: {host} has slots 0..{hosts[host] - 1}, "
                                    f"not {bad}")
        chosen[host] = slots
    return chosen


def resources(hosts, include="", exclude="", num_nodes=-1, num_gpus=-1):
    """{host: [slot, ...]} that run ranks: the hostfile's `hosts` ({host: count}) with
    DeepSpeed's --include/--exclude, --num_nodes and --num_gpus applied."""
    if include and exclude:
        raise HostfileError("--include and --exclude are both given; pass one")
    active = {h: list(range(n)) for h, n in hosts.items()}
    if include:
        chosen = _parse_spec("--include", include, hosts)
        active = {h: (chosen[h] if chosen[h] is not None else active[h])
                  for h in hosts if h in chosen}
    elif exclude:
        for host, slots in _parse_spec("--exclude", exclude, hosts).items():
            active[host] = [] if slots is None else [s for s in active[host] if s not in slots]
    active = {h: slots for h, slots in active.items() if slots}
    if num_nodes > 0:
        if num_nodes > len(active):
            raise HostfileError(f"--num_nodes {num_nodes}: the hostfile leaves "
                                f"{len(active)} host(s) to use")
        active = dict(list(active.items())[:num_nodes])
    if num_gpus > 0:
        short = [h for h, slots in active.items() if len(slots) < num_gpus]
        if short:
            raise HostfileError(f"--num_gpus {num_gpus}: {', '.join(short)} has fewer slots")
        active = {h: slots[:num_gpus] for h, slots in active.items()}
    if not active:
        raise HostfileError("no host is left to run on after --include/--exclude")
    return active
