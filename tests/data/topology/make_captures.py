"""Writes the ibnetdiscover fixtures in this folder (run once; the output is committed).

The captures imitate real ``ibnetdiscover`` text output, quirks included:

``dgx-superpod.ibnetdiscover`` - two rail-optimized scalable units (SU) of 4 DGX
nodes with 8 HCAs each, every HCA on a different rail leaf of its SU; 4 spines
with 2 parallel links to every leaf; a SHARP aggregation node on every switch;
UFM hosts on a management leaf with a model-only name; login hosts on rail-1
leaves; ``dgx-a09-03 mlx5_5`` unnamed (resolvable through the other rails);
``dgx-a10-02 mlx5_2`` unnamed but sharing its system image GUID with mlx5_3;
one stray unnamed adapter on the management leaf (not resolvable).

``dgx-superpod-ports.ibnetdiscover`` - the same fabric in the ``ibnetdiscover -p``
format (no system image GUIDs there).

``hpc-3level.ibnetdiscover`` - a classic 3-level tree, one HCA per node: two pods
of two leaves under two spines each, both pods under two core switches; one
host description carries an FQDN.
"""

from pathlib import Path

HERE = Path(__file__).parent
HEADER = """#
# Topology file: generated on Tue Mar  5 10:11:12 2024
#
# Initiated from node {root} port {root}
"""


class Capture:
    def __init__(self) -> None:
        self.switches: dict[str, dict] = {}
        self.cas: dict[str, dict] = {}

    def switch(self, guid: str, desc: str, ports: int = 64) -> str:
        self.switches[guid] = {"desc": desc, "ports": {}, "nports": ports}
        return guid

    def ca(self, guid: str, desc: str, sysimg: str | None = None) -> str:
        self.cas[guid] = {"desc": desc, "sysimg": sysimg or guid, "ports": {}}
        return guid

    def link(self, a: str, pa: int, b: str, pb: int) -> None:
        self._dev(a)["ports"][pa] = (b, pb)
        self._dev(b)["ports"][pb] = (a, pa)

    def _dev(self, guid: str) -> dict:
        return self.switches.get(guid) or self.cas[guid]

    def _ref(self, guid: str, port: int) -> str:
        if guid in self.switches:
            return f'"S-{guid}"[{port}]'
        return f'"H-{guid}"[{port}]({guid})'

    def render(self, root: str) -> str:
        out = [HEADER.format(root=root)]
        lid = {g: 10 + i for i, g in enumerate([*self.switches, *self.cas])}
        for guid, sw in self.switches.items():
            out.append(
                f"vendid=0x2c9\ndevid=0xd2f0\nsysimgguid=0x{guid}\nswitchguid=0x{guid}({guid})\n"
                f'Switch\t{sw["nports"]} "S-{guid}"\t\t# "{sw["desc"]}" enhanced port 0 lid {lid[guid]} lmc 0'
            )
            for port in sorted(sw["ports"]):
                peer, peer_port = sw["ports"][port]
                desc = self._dev(peer)["desc"]
                out.append(f'[{port}]\t{self._ref(peer, peer_port)}\t\t# "{desc}" lid {lid[peer]} 4xNDR')
            out.append("")
        for guid, ca in self.cas.items():
            out.append(
                f"vendid=0x2c9\ndevid=0x1021\nsysimgguid=0x{ca['sysimg']}\ncaguid=0x{guid}\n"
                f'Ca\t1 "H-{guid}"\t\t# "{ca["desc"]}"'
            )
            for port in sorted(ca["ports"]):
                peer, peer_port = ca["ports"][port]
                desc = self._dev(peer)["desc"]
                out.append(
                    f'[{port}]({guid}) \t"S-{peer}"[{peer_port}]\t\t# lid {lid[guid]} lmc 0 "{desc}" '
                    f"lid {lid[peer]} 4xNDR"
                )
            out.append("")
        return "\n".join(out)

    def render_ports(self) -> str:
        """The ``ibnetdiscover -p`` form: one line per linked port, seen from each end."""
        lid = {g: 10 + i for i, g in enumerate([*self.switches, *self.cas])}
        kind = {**dict.fromkeys(self.switches, "SW"), **dict.fromkeys(self.cas, "CA")}
        out = []
        for guid in [*self.switches, *self.cas]:
            dev = self._dev(guid)
            for port in sorted(dev["ports"]):
                peer, peer_port = dev["ports"][port]
                out.append(
                    f"{kind[guid]} {lid[guid]:5d} {port:4d} 0x{guid} 4x NDR - {kind[peer]} {lid[peer]:5d} "
                    f"{peer_port:4d} 0x{peer} ( '{dev['desc']}' - '{self._dev(peer)['desc']}' )"
                )
        return "\n".join(out) + "\n"


def superpod_capture() -> Capture:
    cap = Capture()
    unnamed = "MT4129 ConnectX7   Mellanox Technologies"
    spines = [cap.switch(f"fc6a1c0300{0x100 + s:06x}", f"MF0;A11-P1-IBSPINE-01-0{s + 1}:MQM9790/U1") for s in range(4)]
    leaves = []
    for su, row in ((1, "A09"), (2, "A10")):
        rails = [
            cap.switch(f"fc6a1c0300{su * 0x10 + r:06x}", f"MF0;{row}-P1-IBLEAF-0{su}-0{r + 1}:MQM9701/U1")
            for r in range(8)
        ]
        leaves.extend(rails)
        for n in range(1, 5):
            host = f"dgx-{row.lower()}-0{n}"
            for r, leaf in enumerate(rails):
                guid = f"b8cef60300{su:02x}{n:02x}{r:02x}"
                desc = f"{host} mlx5_{r}"
                sysimg = None
                if host == "dgx-a09-03" and r == 5:
                    desc = unnamed
                if host == "dgx-a10-02" and r in (2, 3):
                    sysimg = f"b8cef60300{su:02x}{n:02x}02"
                    if r == 2:
                        desc = unnamed
                cap.link(cap.ca(guid, desc, sysimg), 1, leaf, n)
        login = cap.ca(f"b8cef60301{su:02x}0000", f"login0{su} mlx5_0")
        cap.link(login, 1, rails[0], 17)
    mgmt = cap.switch("fc6a1c0300000200", "MF0;MQM9700/U1")
    for k in (1, 2):
        cap.link(cap.ca(f"b8cef60302000{k}00", f"ufm0{k} mlx5_0"), 1, mgmt, k)
    cap.link(cap.ca("b8cef60303000000", unnamed), 1, mgmt, 5)
    for j, leaf in enumerate([*leaves, mgmt]):
        for s, spine in enumerate(spines):
            for k in range(2):
                cap.link(leaf, 33 + 2 * s + k, spine, 2 * j + 1 + k)
    for i, sw in enumerate([*spines, *leaves, mgmt]):
        an = cap.ca(f"fc6a1c0301{i:06x}", "Mellanox Technologies Aggregation Node")
        cap.link(an, 1, sw, 65)
    return cap


def three_level() -> str:
    cap = Capture()
    cores = [cap.switch(f"0002c90300{0x300 + c:06x}", f"MF0;R00-IBCORE-0{c + 1}:MQM8700/U1", 40) for c in range(2)]
    node = 1
    for pod in (1, 2):
        spines = [
            cap.switch(f"0002c90300{0x200 + pod * 4 + s:06x}", f"MF0;R0{pod}-IBSPINE-0{s + 1}:MQM8700/U1", 40)
            for s in range(2)
        ]
        for lf in range(2):
            leaf = cap.switch(f"0002c90300{0x100 + pod * 4 + lf:06x}", f"MF0;R0{pod}-IBLEAF-0{lf + 1}:MQM8700/U1", 40)
            for port in range(1, 7):
                name = f"cn{node:03d}"
                desc = f"{name}.hpc.example mlx5_0" if node == 13 else f"{name} HCA-1"
                cap.link(cap.ca(f"98039b0300{node:06x}", desc), 1, leaf, port)
                node += 1
            for s, spine in enumerate(spines):
                cap.link(leaf, 21 + s, spine, 1 + lf)
        for s, spine in enumerate(spines):
            for c, core in enumerate(cores):
                cap.link(spine, 31 + c, core, 1 + (pod - 1) * 2 + s)
    return cap.render("98039b0300000001")


if __name__ == "__main__":
    pod = superpod_capture()
    (HERE / "dgx-superpod.ibnetdiscover").write_text(pod.render("b8cef60300010100"))
    (HERE / "dgx-superpod-ports.ibnetdiscover").write_text(pod.render_ports())
    (HERE / "hpc-3level.ibnetdiscover").write_text(three_level())
