"""In-memory snapshots (``checkpoint.memory_interval_steps``): lose at most a step to a rank or node failure.

After every K-th step each rank copies its state into a host buffer (the only part on the
critical path, :func:`snapshot.capture`); a background thread then checksums it, puts it into
the holder process on the rank's node (:mod:`air_hpc.runtime.snapholder`, owned by the
supervisor, so it outlives the rank), and exchanges copies with the buddy ranks over a
dedicated gloo group: each rank sends its snapshot to its buddy on another node (another leaf
switch or NVLink block where the fabric has more than one) and puts the copy it receives into
its own node's holder. The next snapshot waits for the previous one's exchange, so every rank
ships every snapshot in the same order (the pairs stay matched) and a host buffer is reused.

On a start, before the persistent checkpoint is looked for, the ranks gather what their nodes'
holders hold and pick the newest step that is complete across all ranks and not older than the
newest persistent checkpoint. Each owner's snapshot comes from its own node when that holder has
it, else from the node that holds the buddy copy (a dead node's shards), sent point to point. A
snapshot that fails its checksum or header check is reported (``snapshot_skipped``) and never
loaded: the next copy of it is tried, then the next older step, then the persistent checkpoint.
"""

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from air_hpc.backend.collectives import any_rank, gather_objects
from air_hpc.config.layout import ParallelLayout
from air_hpc.records.events import EventLog, MemoryResume, SnapshotBuddies, SnapshotSkipped
from air_hpc.resilience import snapshot
from air_hpc.resilience.holder import SOCKET_DIR_ENV, BlobWriter, HolderClient, HolderError, socket_path
from air_hpc.resilience.snapshot import Capture, SnapshotError, SnapshotInfo
from air_hpc.resilience.state import Loaded, capture_rng
from air_hpc.resilience.training_state import TrainingState

log = logging.getLogger(__name__)

#: The snapshot group's timeout: a buddy that stopped answering fails the exchange instead of blocking for 30 min.
EXCHANGE_TIMEOUT_S = 120


@dataclass(frozen=True)
class BuddyPlan:
    """Where each rank's copy goes: ``buddy[r]`` on another node, or None with ``refused`` saying why."""

    buddy: tuple[int | None, ...]
    refused: str | None

    def senders_to(self, rank: int) -> list[int]:
        """The ranks whose copies ``rank`` keeps."""
        return [r for r, b in enumerate(self.buddy) if b == rank]


def pick_buddies(hosts: Sequence[str], domain_of: Mapping[str, str] | None = None) -> BuddyPlan:
    """Each rank's buddy: the same local slot on the node ``shift`` places further in rank order.

    ``shift`` is the smallest that puts every node's buddy in another domain (leaf switch, NVLink
    block) when ``domain_of`` knows the nodes and has more than one domain; otherwise 1 (another
    node). A buddy on the rank's own node would die with it: with one node there is none.
    """
    nodes = list(dict.fromkeys(hosts))
    if len(nodes) < 2:
        why = f"every rank runs on {nodes[0] if nodes else '?'}: a buddy on the same node dies with it"
        return BuddyPlan(tuple(None for _ in hosts), why + "; snapshots survive a rank failure only")
    slots = {node: [r for r, h in enumerate(hosts) if h == node] for node in nodes}
    shift = 1
    domains = [domain_of.get(n) for n in nodes] if domain_of else []
    if domains and None not in domains and len(set(domains)) > 1:
        apart = [
            s
            for s in range(1, len(nodes))
            if all(domains[i] != domains[(i + s) % len(nodes)] for i in range(len(nodes)))
        ]
        shift = apart[0] if apart else 1
    buddy: list[int | None] = [None] * len(hosts)
    for i, node in enumerate(nodes):
        target = slots[nodes[(i + shift) % len(nodes)]]
        for j, rank in enumerate(slots[node]):
            buddy[rank] = target[j % len(target)]
    return BuddyPlan(tuple(buddy), None)


@dataclass(frozen=True)
class _Held:
    """Which ranks can serve each (owner, step) from their node's holder, owner's own node first."""

    sources: dict[tuple[int, int], list[int]]
    nbytes: dict[tuple[int, int], int]

    @classmethod
    def gather(cls, mine: list[dict[str, Any]], world: int, layout: ParallelLayout, rank: int) -> "_Held":
        everyone = gather_objects(mine)
        sources: dict[tuple[int, int], list[int]] = {}
        nbytes: dict[tuple[int, int], int] = {}
        for holder_rank, items in enumerate(everyone):
            for item in items:
                try:
                    info = SnapshotInfo.from_json(item)
                except SnapshotError:
                    continue
                if info.world != world or info.layout != layout:
                    continue
                key = (info.owner, info.step)
                sources.setdefault(key, [])
                if holder_rank not in sources[key]:
                    sources[key].append(holder_rank)
                nbytes[key] = int(item["bytes"])
        for (owner, _), ranks in sources.items():
            ranks.sort(key=lambda r: (r != owner, r))
        return cls(sources, nbytes)

    def complete_steps(self, world: int, not_before: int | None) -> list[int]:
        steps = {s for _, s in self.sources}
        whole = [s for s in steps if all((o, s) in self.sources for o in range(world))]
        return sorted((s for s in whole if not_before is None or s >= not_before), reverse=True)


class MemorySnapshots:
    """One rank's in-memory snapshots: take them every ``interval`` steps, restore the newest on a start."""

    def __init__(
        self,
        interval: int,
        layout: ParallelLayout,
        hosts: Sequence[str],
        holder: HolderClient,
        events: EventLog | None,
        domain_of: Mapping[str, str] | None = None,
    ) -> None:
        """Collective (creates the snapshot group): ``hosts`` is every rank's node, in rank order."""
        self.interval = interval
        self.layout = layout
        self.hosts = tuple(hosts)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = len(hosts)
        self.holder = holder
        self.events = events
        self.plan = pick_buddies(hosts, domain_of)
        self.group = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=EXCHANGE_TIMEOUT_S))
            if dist.is_initialized()
            else None
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
        self._inflight: Future[None] | None = None
        self._buffer: torch.Tensor | None = None
        self.stall_s = 0.0
        """Time the training thread spent in :meth:`after_step` (the host copy and waiting for the previous)."""
        self.ship_s = 0.0
        """Time the background thread spent checksumming, exchanging and storing."""
        self.shard_bytes = 0
        self.failures = 0
        if self.plan.refused:
            log.warning("in-memory snapshots: no buddy copies: %s", self.plan.refused)
        if self.rank == 0 and events is not None:
            buddies = {str(r): b for r, b in enumerate(self.plan.buddy) if b is not None}
            events.emit(SnapshotBuddies(buddies=buddies, refused=self.plan.refused))

    # -- taking snapshots -----------------------------------------------------------------------
    def after_step(self, step: int, training: TrainingState, device: str = "cpu") -> None:
        """Snapshot ``training`` (at ``step``, with its progress) if due; returns once the host copy is taken."""
        if step % self.interval:
            return
        began = time.perf_counter()
        self.wait()
        info = SnapshotInfo(self.rank, step, self.world, self.layout)
        tree = snapshot.state_tree(training, capture_rng())
        cap = snapshot.capture(info, tree, reuse=self._buffer, pin=device == "cuda")
        self._buffer = cap.buffer
        self.shard_bytes = cap.buffer.numel()
        self._inflight = self._pool.submit(self._ship, cap)
        self.stall_s += time.perf_counter() - began

    def wait(self) -> None:
        """Until the previous snapshot is in the holders (its failure is logged; training goes on)."""
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        try:
            inflight.result()
        except (HolderError, SnapshotError, RuntimeError, OSError) as exc:
            self.failures += 1
            log.warning("in-memory snapshot not stored: %s", exc)

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)
        self.holder.close()

    def _ship(self, cap: Capture) -> None:
        """Seal, exchange with the buddies, put our own and the received copies into this node's holder."""
        began = time.perf_counter()
        try:
            self._seal_and_store(cap)
        finally:
            self.ship_s += time.perf_counter() - began

    def _seal_and_store(self, cap: Capture) -> None:
        """Checksum while the data is on its way to the buddy (gloo's threads), put ours, then the copies we keep.

        The digest goes last, once computed; the copies we keep are received straight into the memfds
        handed to the holder (:class:`~air_hpc.resilience.holder.BlobWriter`).
        """
        sending = self._send_to_buddy(cap)
        cap.seal()
        if sending:
            digest = _bytes_tensor(cap.digest)
            sending.append((dist.isend(digest, self.plan.buddy[self.rank], group=self.group), digest))
        problems: list[str] = []
        try:
            self.holder.put(self.rank, cap.info.step, cap.info.to_json(), cap.parts())
        except HolderError as exc:
            problems.append(str(exc))
        received = self._receive_from_senders()
        for work, _ in sending:
            work.wait()
        for owner, writer in received:
            try:
                self.holder.put_memfd(
                    owner, cap.info.step, {**cap.info.to_json(), "owner": owner}, writer.seal(), writer.size
                )
            except HolderError as exc:
                problems.append(str(exc))
        if problems:
            raise HolderError("; ".join(problems))

    def _send_to_buddy(self, cap: Capture) -> list[tuple[Any, torch.Tensor]]:
        """Start sending our snapshot's sizes, header and data to our buddy (one gloo group, in order)."""
        buddy = self.plan.buddy[self.rank]
        if self.group is None or buddy is None:
            return []
        header, data, _ = cap.parts()
        sizes = torch.tensor([len(header), len(data)], dtype=torch.int64)
        return [
            (dist.isend(tensor, buddy, group=self.group), tensor)
            for tensor in (sizes, _bytes_tensor(header), cap.buffer)
        ]

    def _receive_from_senders(self) -> list[tuple[int, BlobWriter]]:
        """The snapshots we keep for others, in the senders' order, each received into its own memfd."""
        if self.group is None:
            return []
        received = []
        for sender in self.plan.senders_to(self.rank):
            sizes = torch.empty(2, dtype=torch.int64)
            dist.recv(sizes, sender, group=self.group)
            header, data = (int(n) for n in sizes.tolist())
            writer = BlobWriter(header + data + snapshot.DIGEST_BYTES)
            try:
                self._receive_into(writer, header, data, sender)
            except BaseException:
                writer.close()
                raise
            received.append((sender, writer))
        return received

    def _receive_into(self, writer: BlobWriter, header: int, data: int, sender: int) -> None:
        """Header, data and digest from ``sender`` into ``writer``'s mapping (no tensor views it afterwards)."""
        if writer.map is None:  # never: the digest alone has bytes
            raise SnapshotError(f"snapshot from rank {sender}: nothing to receive into")
        blob = torch.frombuffer(writer.map, dtype=torch.uint8)
        for begin, end in ((0, header), (header, header + data), (header + data, writer.size)):
            dist.recv(blob[begin:end], sender, group=self.group)

    # -- restoring ------------------------------------------------------------------------------
    def restore(self, training: TrainingState, newest_checkpoint: int | None, device: str = "cpu") -> Loaded | None:
        """Collective: load the newest snapshot complete across ranks and not older than ``newest_checkpoint``."""
        began = time.perf_counter()
        try:
            mine = self.holder.listing()
        except HolderError as exc:
            log.warning("in-memory snapshots unavailable on this node: %s", exc)
            mine = []
        held = _Held.gather(mine, self.world, self.layout, self.rank)
        for step in held.complete_steps(self.world, newest_checkpoint):
            decoded = self._fetch(step, held)
            if decoded is None:
                continue
            snapshot.restore(
                training, decoded, torch.device(device, torch.cuda.current_device()) if device == "cuda" else None
            )
            progress = decoded.tree["progress"]
            if self.rank == 0:
                sources = {str(o): self.hosts[held.sources[(o, step)][0]] for o in range(self.world)}
                self._emit(
                    MemoryResume(
                        step=step,
                        seconds=round(time.perf_counter() - began, 4),
                        sources=sources,
                        newest_checkpoint=newest_checkpoint,
                    )
                )
            log.info("resumed from the in-memory snapshot of step %d", step)
            return Loaded(
                step=step, extra=dict(progress), saved_layout=self.layout, layout_changed=False, rng_restored=True
            )
        return None

    def _fetch(self, step: int, held: _Held) -> snapshot.Decoded | None:
        """This rank's snapshot of ``step``, trying each holder of each owner's copy in turn (all ranks agree)."""
        tries = {o: list(held.sources[(o, step)]) for o in range(self.world)}
        mine: snapshot.Decoded | None = None
        while True:
            plan = {o: t[0] for o, t in tries.items() if t}
            blob = self._move(step, plan, held)
            why = None
            if self.rank in plan:
                try:
                    mine = snapshot.decode(blob or b"", SnapshotInfo(self.rank, step, self.world, self.layout))
                except SnapshotError as exc:
                    why = str(exc)
            verdicts = gather_objects(why)
            for owner, problem in enumerate(verdicts):
                if owner not in plan:
                    continue
                if problem is None:
                    tries[owner] = []
                    continue
                node = self.hosts[plan[owner]]
                log.warning("snapshot of step %d of rank %d from %s skipped: %s", step, owner, node, problem)
                if self.rank == 0:
                    self._emit(SnapshotSkipped(step=step, owner=owner, node=node, why=problem))
                tries[owner].pop(0)
            if not any(verdicts):
                break
        return mine if not any_rank(mine is None) else None

    def _move(self, step: int, plan: Mapping[int, int], held: _Held) -> bytearray | None:
        """Every source sends what its holder has to the owner; returns this rank's blob, if it is in ``plan``.

        A source whose holder fails to answer sends zeros of the listed size: the owner's checksum rejects them,
        and the owner's verdict moves every rank on to the next copy together.
        """
        sends: list[tuple[Any, torch.Tensor]] = []
        blob: bytearray | None = None
        for owner, source in plan.items():
            if source != self.rank:
                continue
            size = held.nbytes[(owner, step)]
            try:
                data = self.holder.get(owner, step)
            except HolderError as exc:
                log.warning("snapshot of step %d of rank %d: %s", step, owner, exc)
                data = bytearray(size)
            if len(data) != size:
                data = bytearray(size)
            if owner == self.rank:
                blob = data
            else:
                tensor = _bytes_tensor(data)
                sends.append((dist.isend(tensor, owner, group=self.group), tensor))
        giver = plan.get(self.rank)
        if giver is not None and giver != self.rank:
            incoming = torch.empty(held.nbytes[(self.rank, step)], dtype=torch.uint8)
            dist.recv(incoming, giver, group=self.group)
            blob = bytearray(incoming.numpy().tobytes())
        for work, _ in sends:
            work.wait()
        return blob

    def _emit(self, payload: Any) -> None:
        if self.events is not None:
            self.events.emit(payload)


def _view(tensor: torch.Tensor) -> memoryview:
    array: Any = tensor.numpy()
    return memoryview(array)


def _bytes_tensor(data: bytes | bytearray | memoryview) -> torch.Tensor:
    raw = bytearray(data) if not isinstance(data, bytearray) else data
    return torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)


def domains(topology_file: Path | None) -> dict[str, str]:
    """Each node's leaf switch or block from the cluster's topology file (empty without one or when unreadable)."""
    if topology_file is None:
        return {}
    from air_hpc.errors import TopologyError
    from air_hpc.topology import files

    try:
        return dict(files.read_nearness(topology_file.read_text(), str(topology_file)).leaf_of)
    except (OSError, TopologyError) as exc:
        log.warning("topology %s unusable for snapshot buddies (%s); any other node will do", topology_file, exc)
        return {}


def open_snapshots(
    interval: int, layout: ParallelLayout, host: str, events: EventLog | None, topology_file: Path | None
) -> MemorySnapshots | None:
    """Collective: this rank's snapshots, or None (on every rank) when the job runs without holders."""
    import os

    directory = os.environ.get(SOCKET_DIR_ENV)
    if any_rank(not directory):
        log.warning(
            "checkpoint.memory_interval_steps is set but this start has no snapshot holders "
            "(they come with the Slurm supervisor, not the local executor); in-memory snapshots are off"
        )
        return None
    hosts = [str(h) for h in gather_objects(host)]
    holder = HolderClient(socket_path(Path(str(directory)), host))
    return MemorySnapshots(interval, layout, hosts, holder, events, domains(topology_file))
