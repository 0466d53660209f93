"""Turn an ``ibnetdiscover`` capture (default or ``-p`` format) into a :class:`Fabric` Slurm can use.

Real captures are messy, and each quirk has a rule here:

- switch names like ``MF0;A09-P1-IBLEAF-04-04:MQM9701/U1`` become ``A09-P1-IBLEAF-04-04``;
  switches described only by their model get ``sw-<guid>``;
- host names are the first word of the HCA description (``dgx-a09-01 mlx5_0``);
- HCAs described by the adapter (``MT4129 ConnectX7   Mellanox Technologies``)
  are resolved to a host through a named HCA with the same system image GUID, or
  through the other rails: a leaf grouped with others serving the same hosts,
  where every named HCA on the same port number of the sibling leaves belongs to
  one host. The rest are reported, not guessed;
- SHARP aggregation nodes, routers, and hosts outside ``--nodes`` / the name
  pattern (UFM, login, management) are left out and reported;
- parallel links between two switches count once for the structure;
- multi-rail pods (each HCA of a node on a different leaf) are grouped: leaves
  that serve (mostly) the same hosts become one logical leaf, because Slurm
  needs each node under exactly one leaf. Upper levels are grouped the same way
  (parallel spines serving the same leaves become one logical spine), and each
  grouping is described in a comment for topology.conf.
"""

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from air_hpc.errors import TopologyError
from air_hpc.slurm import hostlist as hostlists
from air_hpc.topology.fabric import Fabric, SwitchSpec, build_fabric

log = logging.getLogger(__name__)

_HEADER_KV = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|rtguid)=(\S+)$")
_NODE = re.compile(r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR]-[0-9a-fA-F]+)"\s*(?:#\s*"(.*)"(.*))?$')
_PORT = re.compile(
    r"^\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s+"
    r'"([SHR]-[0-9a-fA-F]+)"\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s*(?:#\s*(.*))?$'
)
_UNNAMED_HCA = re.compile(r"^\s*$|^MT\d+\b|Mellanox Technologies|ConnectX|^Nvidia\b", re.IGNORECASE)
_AGGREGATION = re.compile(r"aggregation node", re.IGNORECASE)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

#: two leaves (or two upper switches) are one logical switch when they share at least this
#: fraction of the smaller one's hosts (children): rails of one pod share all, a miscabled rail shares ~none
GROUP_OVERLAP = 0.5


@dataclass
class Device:
    """One Switch, Ca (HCA) or Rt (router) of a capture; ``sysimg`` is empty in the ``-p`` format."""

    guid_id: str
    kind: str
    desc: str
    sysimg: str
    line: int


@dataclass(frozen=True)
class ImportResult:
    fabric: Fabric
    #: one line per thing left out, with the reason (printed on stderr by the CLI)
    skipped: tuple[str, ...] = ()
    #: groupings and other decisions worth knowing (also written as comments)
    notes: tuple[str, ...] = ()


@dataclass
class Capture:
    """What :func:`parse_capture` understood of a capture: its devices and the links between their ports."""

    devices: dict[str, Device] = field(default_factory=dict)
    #: (device, port) -> (device, port), both directions
    links: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    #: device -> its linked ports, so a device's links are found without scanning them all
    ports: dict[str, set[int]] = field(default_factory=dict)
    #: first line that mentions a link to a device id, for "unknown switch" errors
    referenced_at: dict[str, int] = field(default_factory=dict)

    def link(self, local: tuple[str, int], remote: tuple[str, int], number: int, where: str) -> None:
        known = self.links.get(local)
        if known is not None and known != remote:
            raise TopologyError(f"{where}: port {local[1]} of {local[0]} linked twice ({known[0]} and {remote[0]})")
        self.links[local] = remote
        self.links.setdefault(remote, local)
        self.ports.setdefault(local[0], set()).add(local[1])
        self.ports.setdefault(remote[0], set()).add(remote[1])
        self.referenced_at.setdefault(remote[0], number)

    def check(self, source: str) -> None:
        if not self.devices:
            raise TopologyError(f"{source}: no Switch or Ca entries; is this ibnetdiscover output?")
        for dev_id, ref_line in self.referenced_at.items():
            if dev_id not in self.devices:
                raise TopologyError(f"{source}:{ref_line}: link to {dev_id}, which the capture never defines")


_PORTS_LINE = re.compile(
    r"^(SW|CA|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+[^-']*?"
    r"(?:-\s+(SW|CA|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+\(\s*'(.*)'\s+-\s+'(.*)'\s*\)|'(.*)')\s*$"
)
_PORTS_KIND = {"SW": ("Switch", "S"), "CA": ("Ca", "H"), "RT": ("Rt", "R")}


def is_ports_format(text: str) -> bool:
    """``ibnetdiscover -p`` output starts its lines with SW/CA/RT and a LID."""
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            return re.match(r"^(SW|CA|RT)\s+\d+\s+\d+\s+0x", line) is not None
    return False


def parse_ports_capture(text: str, source: str) -> Capture:
    """The ``ibnetdiscover -p`` (one line per port) format; it has no system image GUIDs."""
    cap = Capture()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PORTS_LINE.match(line)
        if not match:
            raise TopologyError(
                f"{source}:{number}: cannot parse {line[:60]!r}; expected an 'ibnetdiscover -p' line "
                "like \"CA 44 1 0x0002c9... 4x NDR - SW 2 17 0x0008f1... ( 'host mlx5_0' - 'switch' )\""
            )
        kind, _, port, guid, peer_kind, _, peer_port, peer_guid, desc, peer_desc, alone = match.groups()
        local = _ports_device(cap, kind, guid, desc if peer_kind else alone, number)
        if peer_kind:
            remote = _ports_device(cap, peer_kind, peer_guid, peer_desc, number)
            cap.link((local, int(port)), (remote, int(peer_port)), number, f"{source}:{number}")
    cap.check(source)
    return cap


def _ports_device(cap: Capture, kind: str, guid: str, desc: str, number: int) -> str:
    label, letter = _PORTS_KIND[kind]
    dev_id = f"{letter}-{guid.lower()}"
    if dev_id not in cap.devices:
        cap.devices[dev_id] = Device(dev_id, label, " ".join(desc.split()), "", number)
    return dev_id


def parse_capture(text: str, source: str) -> Capture:
    """Devices and links of the capture (default or ``-p`` format); every line must be understood."""
    if is_ports_format(text):
        return parse_ports_capture(text, source)
    cap = Capture()
    current: Device | None = None
    pending_sysimg = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        kv = _HEADER_KV.match(line)
        if kv:
            if kv.group(1) == "vendid":
                current = None
            if kv.group(1) == "sysimgguid":
                pending_sysimg = kv.group(2).lower().removeprefix("0x")
            continue
        node = _NODE.match(line)
        if node:
            kind, guid_id, desc = node.group(1), node.group(3), node.group(4) or ""
            if guid_id in cap.devices:
                raise TopologyError(
                    f"{where}: device {guid_id} defined twice (first at line {cap.devices[guid_id].line})"
                )
            current = Device(guid_id, kind, " ".join(desc.split()), pending_sysimg, number)
            cap.devices[guid_id] = current
            pending_sysimg = ""
            continue
        port = _PORT.match(line)
        if port:
            if current is None:
                raise TopologyError(f"{where}: port line outside a Switch/Ca block: {line[:60]!r}")
            cap.link((current.guid_id, int(port.group(1))), (port.group(3), int(port.group(4))), number, where)
            continue
        raise TopologyError(
            f"{where}: cannot parse {line[:60]!r}; expected an ibnetdiscover line "
            "(vendid=/switchguid=/caguid=, 'Switch N \"S-..\"', 'Ca N \"H-..\"' or '[port] \"S-..\"[port]')"
        )
    cap.check(source)
    return cap


def switch_name(desc: str, guid_id: str) -> str:
    """``MF0;A09-P1-IBLEAF-04-04:MQM9701/U1`` -> ``A09-P1-IBLEAF-04-04``; model-only names -> ``sw-<guid>``."""
    name = desc.split(";")[-1].split(":")[0].strip()
    if not name or "Mellanox Technologies" in desc or re.fullmatch(r"(MQM|QM|SX|MSB|CS)\d+\S*", name):
        return "sw-" + guid_id[2:].lower()
    return _UNSAFE.sub("-", name).strip("-")


def host_name(desc: str) -> str:
    """``dgx-a09-01.cluster mlx5_0`` -> ``dgx-a09-01``."""
    return desc.split()[0].split(".")[0]


def import_ibnetdiscover(
    text: str,
    source: str,
    nodes: Iterable[str] | None = None,
    node_pattern: str | None = None,
) -> ImportResult:
    """Build a fabric of compute nodes; ``nodes`` and/or ``node_pattern`` (a regex) say which hosts count.

    The phases, in order: parse; find every host's rails; name unnamed HCAs by
    system image GUID; keep the compute hosts; group rail leaves; name the rest
    of the unnamed HCAs by rail; put each host under one leaf group; build the
    levels above.
    """
    cap = parse_capture(text, source)
    nodes = list(nodes) if nodes is not None else None
    out = _Decisions()
    switches = {d.guid_id: d for d in cap.devices.values() if d.kind == "Switch"}
    names = _unique_names({sid: switch_name(d.desc, sid) for sid, d in switches.items()})

    found = _find_rails(cap, switches, out)
    still_unnamed = _name_by_system_image(found, names, out)
    compute = _compute_hosts(found.rails, _host_filter(nodes, node_pattern, source), nodes, names, source, out)
    leaf_groups = _group_switches({h: {sw for sw, _ in r} for h, r in compute.items()})
    group_of = {sw: i for i, group in enumerate(leaf_groups) for sw in group}
    _name_by_rail(still_unnamed, compute, group_of, leaf_groups, names, out)
    host_leaf = _leaf_of_each_host(compute, group_of, out)

    unused = found.edge_switches - set(group_of)
    out.skipped.extend(f"switch {names[sw]}: no compute nodes attached" for sw in sorted(unused, key=names.__getitem__))
    specs = _build_levels(leaf_groups, host_leaf, names, _switch_adjacency(cap, switches), unused, out)
    for line in out.skipped:
        log.info("skipped: %s", line)
    return ImportResult(fabric=build_fabric(specs, source), skipped=tuple(out.skipped), notes=tuple(out.notes))


@dataclass
class _Decisions:
    """What the phases left out (``skipped``) and decided (``notes``), in the order they did it."""

    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


#: an HCA without a host name, on port ``port`` of switch ``switch``
_Unnamed = tuple[Device, str, int]


@dataclass
class _Rails:
    #: host -> [(switch id, switch port)], every rail of every named host
    rails: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    unnamed: list[_Unnamed] = field(default_factory=list)
    #: switches with any HCA attached
    edge_switches: set[str] = field(default_factory=set)
    host_by_sysimg: dict[str, str] = field(default_factory=dict)


def _find_rails(cap: Capture, switches: Mapping[str, Device], out: _Decisions) -> _Rails:
    """Every HCA's links to switches, by host name where the HCA has one; routers and SHARP nodes left out."""
    found = _Rails()
    aggregation = 0
    for dev in cap.devices.values():
        if dev.kind == "Rt":
            out.skipped.append(f"router {dev.guid_id} ({dev.desc or 'no description'}): not a compute node")
            continue
        if dev.kind != "Ca":
            continue
        if _AGGREGATION.search(dev.desc):
            aggregation += 1
            continue
        attached = [(cap.links[(dev.guid_id, p)], p) for p in sorted(cap.ports.get(dev.guid_id, ()))]
        for (peer, _), port in attached:
            if peer not in switches:
                out.skipped.append(f"HCA {dev.guid_id} port {port} ({dev.desc}): linked to {peer}, not to a switch")
        to_switch = [(peer, peer_port) for (peer, peer_port), _ in attached if peer in switches]
        found.edge_switches.update(sw for sw, _ in to_switch)
        if not to_switch:
            continue
        if _UNNAMED_HCA.search(dev.desc):
            found.unnamed.extend((dev, sw, port) for sw, port in to_switch)
            continue
        host = host_name(dev.desc)
        found.rails.setdefault(host, []).extend(to_switch)
        if dev.sysimg:
            found.host_by_sysimg.setdefault(dev.sysimg, host)
    if aggregation:
        out.skipped.append(f"{aggregation} SHARP aggregation node(s): switch-internal, not compute nodes")
    return found


def _name_by_system_image(found: _Rails, names: Mapping[str, str], out: _Decisions) -> list[_Unnamed]:
    """Give unnamed HCAs the host of a named HCA on the same card; return those still unnamed."""
    still_unnamed: list[_Unnamed] = []
    for dev, sw, port in found.unnamed:
        same_card = found.host_by_sysimg.get(dev.sysimg) if dev.sysimg else None
        if same_card is None:
            still_unnamed.append((dev, sw, port))
            continue
        found.rails[same_card].append((sw, port))
        out.notes.append(
            f"HCA {dev.guid_id} ({dev.desc}) on {names[sw]} port {port}: {same_card} (same system image GUID)"
        )
    return still_unnamed


def _compute_hosts(
    rails: Mapping[str, list[tuple[str, int]]],
    keep: Callable[[str], bool],
    nodes: list[str] | None,
    names: Mapping[str, str],
    source: str,
    out: _Decisions,
) -> dict[str, list[tuple[str, int]]]:
    """The hosts ``keep`` accepts, with their rails; the others, and listed nodes the capture lacks, reported."""
    compute = {h: r for h, r in rails.items() if keep(h)}
    for host in sorted(set(rails) - set(compute)):
        ports = ", ".join(f"{names[sw]}[{p}]" for sw, p in rails[host])
        out.skipped.append(f"host {host} on {ports}: not a compute node (outside --nodes / pattern)")
    if nodes is not None:
        missing = sorted(set(nodes) - set(compute))
        if missing:
            out.skipped.append(
                f"{len(missing)} listed compute node(s) not in the capture: {hostlists.compress(missing)}"
            )
    if not compute:
        raise TopologyError(f"{source}: no compute nodes found (check --nodes / --node-pattern)")
    return compute


def _name_by_rail(
    still_unnamed: Sequence[_Unnamed],
    compute: dict[str, list[tuple[str, int]]],
    group_of: Mapping[str, int],
    leaf_groups: Sequence[list[str]],
    names: Mapping[str, str],
    out: _Decisions,
) -> None:
    """Add each unnamed HCA to the one host on the same port of its sibling rail leaves, or report it."""
    host_at = {(sw, port): host for host, host_rails in compute.items() for sw, port in host_rails}
    for dev, sw, port in still_unnamed:
        by_rail = _host_by_rail(sw, port, group_of, leaf_groups, host_at)
        if by_rail is None:
            out.skipped.append(
                f"HCA {dev.guid_id} ({dev.desc}) on {names[sw]} port {port}: no host name, and neither its system "
                "image GUID nor the other rails identify one"
            )
            continue
        compute[by_rail].append((sw, port))
        out.notes.append(
            f"HCA {dev.guid_id} ({dev.desc}) on {names[sw]} port {port}: {by_rail} (same port on the other rails)"
        )


def _leaf_of_each_host(
    compute: Mapping[str, list[tuple[str, int]]], group_of: Mapping[str, int], out: _Decisions
) -> dict[str, int]:
    """Host -> the leaf group holding most of its rails (the first on a tie); a split host is noted."""
    host_leaf: dict[str, int] = {}
    for host, host_rails in compute.items():
        votes = Counter(group_of[sw] for sw, _ in host_rails if sw in group_of)
        best = max(votes.values())
        host_leaf[host] = min(g for g, v in votes.items() if v == best)
        if len(votes) > 1:
            out.notes.append(
                f"{host}: rails on {len(votes)} leaf groups (miscabled?); placed under the one holding "
                f"{best} of {len(host_rails)} rails"
            )
    return host_leaf


def _host_filter(nodes: Iterable[str] | None, pattern: str | None, source: str) -> Callable[[str], bool]:
    wanted = set(nodes) if nodes is not None else None
    try:
        regex = re.compile(pattern) if pattern else None
    except re.error as exc:
        raise TopologyError(f"{source}: bad --node-pattern {pattern!r}: {exc}") from None

    def keep(host: str) -> bool:
        return (wanted is None or host in wanted) and (regex is None or regex.fullmatch(host) is not None)

    return keep


def _unique_names(names: Mapping[str, str]) -> dict[str, str]:
    counts = Counter(names.values())
    return {sid: f"{name}-{sid[2:].lower()}" if counts[name] > 1 else name for sid, name in names.items()}


def _group_switches(members_of: Mapping[str, set[str]]) -> list[list[str]]:
    """Group switches whose member sets overlap by :data:`GROUP_OVERLAP`; members_of maps member -> switches.

    Returns groups in order of first appearance.
    """
    size: Counter[str] = Counter()
    for switches in members_of.values():
        size.update(switches)
    shared: Counter[tuple[str, str]] = Counter()
    for switches in members_of.values():
        ordered = sorted(switches)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                shared[(a, b)] += 1
    parent = {sw: sw for sw in size}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for (a, b), n in shared.items():
        if n >= GROUP_OVERLAP * min(size[a], size[b]):
            parent[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for switches in members_of.values():
        for sw in sorted(switches):
            members = groups.setdefault(find(sw), [])
            if sw not in members:
                members.append(sw)
    return list(groups.values())


def _host_by_rail(
    sw: str,
    port: int,
    group_of: Mapping[str, int],
    groups: Sequence[list[str]],
    host_at: Mapping[tuple[str, int], str],
) -> str | None:
    """The one host seen on ``port`` of the sibling rail leaves of ``sw``, if exactly one and not yet on ``sw``."""
    if sw not in group_of:
        return None
    siblings = [s for s in groups[group_of[sw]] if s != sw]
    seen = {host_at[(s, port)] for s in siblings if (s, port) in host_at}
    if len(seen) != 1:
        return None
    host = seen.pop()
    already_on_leaf = any(h == host for (s, _), h in host_at.items() if s == sw)
    return None if already_on_leaf else host


def _switch_adjacency(cap: Capture, switches: Mapping[str, Device]) -> dict[str, Counter[str]]:
    """Switch -> neighbour switch -> number of links (parallel links counted, each once)."""
    adjacency: dict[str, Counter[str]] = {sw: Counter() for sw in switches}
    for (a, _), (b, _) in cap.links.items():
        if a in switches and b in switches and a != b:
            adjacency[a][b] += 1
    return adjacency


def _logical_name(members: Sequence[str], names: Mapping[str, str], fallback: str, taken: set[str]) -> str:
    """One switch keeps its name; a group gets the common prefix of its members' names (cut at - or _)."""
    if len(members) == 1:
        name = names[members[0]]
    else:
        labels = [names[m] for m in members]
        prefix = labels[0]
        for label in labels[1:]:
            while not label.startswith(prefix):
                prefix = prefix[:-1]
        cut = max(prefix.rfind("-"), prefix.rfind("_"))
        name = prefix[:cut].rstrip("-_") if cut > 0 else ""
        name = name or fallback
    if name in taken:
        k = 2
        while f"{name}-{k}" in taken:
            k += 1
        name = f"{name}-{k}"
    taken.add(name)
    return name


def _build_levels(
    leaf_groups: Sequence[list[str]],
    host_leaf: Mapping[str, int],
    names: Mapping[str, str],
    adjacency: Mapping[str, Counter[str]],
    exclude: set[str],
    out: _Decisions,
) -> list[SwitchSpec]:
    """Logical leaves, then each level above: parallel switches over the same children become one."""
    taken: set[str] = set()
    specs, frontier = _leaf_specs(leaf_groups, host_leaf, names, taken, out)
    done = set(frontier) | exclude
    level = 1
    while True:
        candidates = {
            sw: Counter({frontier[n]: c for n, c in adjacency[sw].items() if n in frontier})
            for sw in adjacency
            if sw not in done and any(n in frontier for n in adjacency[sw])
        }
        if not candidates:
            return specs
        done |= set(candidates)
        frontier = _upper_level(candidates, level, specs, names, taken, out)
        level += 1


def _leaf_specs(
    leaf_groups: Sequence[list[str]],
    host_leaf: Mapping[str, int],
    names: Mapping[str, str],
    taken: set[str],
    out: _Decisions,
) -> tuple[list[SwitchSpec], dict[str, str]]:
    """One logical leaf per leaf group with hosts, and the map from each physical leaf to its logical one."""
    specs: list[SwitchSpec] = []
    hosts_of: dict[int, list[str]] = {}
    for host, g in host_leaf.items():
        hosts_of.setdefault(g, []).append(host)
    frontier: dict[str, str] = {}
    for g, members in enumerate(leaf_groups):
        hosts = hosts_of.get(g)
        if not hosts:
            continue
        name = _logical_name(members, names, f"leafgroup{g + 1}", taken)
        comment = ""
        if len(members) > 1:
            comment = (
                f"logical leaf {name}: {len(members)} rail leaves serving the same {len(hosts)} nodes "
                f"({hostlists.compress(names[m] for m in members)}); Slurm needs one leaf per node"
            )
            out.notes.append(comment)
        specs.append(SwitchSpec(name=name, nodes=tuple(hostlists.natural_sorted(hosts)), comment=comment))
        frontier.update(dict.fromkeys(members, name))
    return specs, frontier


def _upper_level(
    candidates: Mapping[str, Counter[str]],
    level: int,
    specs: list[SwitchSpec],
    names: Mapping[str, str],
    taken: set[str],
    out: _Decisions,
) -> dict[str, str]:
    """Append the logical switches over the level below (``candidates``: switch -> links to its children).

    Each child goes under the group with the most children, then the most links
    to it. Returns the new frontier: physical switch -> its logical switch.
    """
    position = {spec.name: i for i, spec in enumerate(specs)}
    groups = _group_switches(_invert(candidates))
    links = []
    for group in groups:
        total: Counter[str] = Counter()
        for sw in group:
            total.update(candidates[sw])
        links.append(total)
    parent_of = {
        child: min(
            (i for i in range(len(groups)) if child in links[i]),
            key=lambda i: (-len(links[i]), -links[i][child], i),
        )
        for child in {c for total in links for c in total}
    }
    frontier: dict[str, str] = {}
    for i, group in enumerate(groups):
        children = sorted((c for c in links[i] if parent_of[c] == i), key=lambda c: position[c])
        if not children:
            out.skipped.extend(
                f"switch {names[sw]}: its links below all lead to switches kept under others" for sw in group
            )
            continue
        if len(children) == 1:
            # a switch over a single child adds a level without joining anything: pass the child up
            frontier.update(dict.fromkeys(group, children[0]))
            continue
        name = _logical_name(group, names, f"level{level}group{i + 1}", taken)
        comment = ""
        if len(group) > 1:
            parallel = hostlists.compress(names[s] for s in group)
            comment = f"logical switch {name}: {len(group)} parallel switches ({parallel})"
            out.notes.append(comment)
        specs.append(SwitchSpec(name=name, children=tuple(children), comment=comment))
        frontier.update(dict.fromkeys(group, name))
    return frontier


def _invert(children_of: Mapping[str, Counter[str]]) -> dict[str, set[str]]:
    """Parent -> children becomes child -> parents (the member sets :func:`_group_switches` groups by)."""
    parents: dict[str, set[str]] = {}
    for parent, children in children_of.items():
        for child in children:
            parents.setdefault(child, set()).add(parent)
    return parents
