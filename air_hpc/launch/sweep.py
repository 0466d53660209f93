"""Submit a sweep: every element loaded and checked first, then ONE Slurm job array (or one local job per element).

Each element is a whole run: its own run directory ``<run.name>-<i>``, its settings in job.json
(``run.sweep``), its own rendered batch script, owner lock and requeues. With Slurm, the array's
task ``i`` runs element ``i``'s script (:mod:`air_hpc.render.array`), so Slurm preempts, requeues
and resumes each element on its own, and each element's owner is the task ``ARRAY_i``. Nothing is
submitted until every element loaded (an unknown key is a did-you-mean, exit 2), its request
matches the others', and the array fits the controller's ``MaxArraySize``. Elements whose final
checkpoint exists are left out (a sweep submitted again finishes what is left).
"""

import contextlib
import logging
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from air_hpc.config import load_job
from air_hpc.config.models import JobConfig, SweepMember
from air_hpc.errors import ConfigError, SlurmError
from air_hpc.launch import submit as submitting
from air_hpc.launch.executors import make_executor
from air_hpc.launch.plan import Plan, expedite_allowed, plan, release
from air_hpc.launch.resume import check_resume
from air_hpc.launch.route import RouteDecision
from air_hpc.ownership.attempts import recorded_jobs
from air_hpc.ownership.owner import Owner, claim
from air_hpc.records.rundir import RunDir
from air_hpc.records.submissions import Executor, record_submission
from air_hpc.records.sweeps import SCRIPT, SweepElement, SweepRecord, sweep_dir, write_sweep
from air_hpc.render.array import array_directives, render_array, shared_request
from air_hpc.render.directives import Directive
from air_hpc.slurm.client import SlurmClient

log = logging.getLogger(__name__)

Settings = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Element:
    index: int
    settings: Settings
    job: JobConfig


@dataclass(frozen=True)
class SweepSubmission:
    record: SweepRecord
    submitted: tuple[int, ...]
    """The elements submitted now (complete ones are left out)."""
    job_id: str | None
    """The array job (slurm); None for the local executor."""
    notes: tuple[str, ...] = ()
    route: RouteDecision | None = None
    """The cluster ``sweep --clusters`` chose for the array (the client was aimed at it), and why."""

    def to_json(self) -> dict[str, object]:
        return {
            **self.record.to_json(),
            "submitted": list(self.submitted),
            "job_id": self.job_id,
            "cluster": None if self.route is None else self.route.cluster,
            "route": None
            if self.route is None
            else {"reason": self.route.reason, "answers": [a.to_json() for a in self.route.answers]},
        }


def load_elements(job_file: str, overrides: Sequence[str], settings: Sequence[Settings]) -> tuple[str, list[Element]]:
    """The sweep's name (the job's run.name) and every element's job; the first bad setting raises, naming it."""
    name = load_job(job_file, overrides).run.name
    elements = []
    for index, combo in enumerate(settings):
        extra = [f"{key}={value}" for key, value in combo]
        try:
            # An array's tasks share one request: nodes are asked for, never pinned (placement.pin_nodes).
            job = load_job(job_file, ["placement.pin_nodes=false", *overrides, *extra, f"run.name={name}-{index}"])
        except ConfigError as exc:
            text = str(exc)
            for key, _ in combo:  # the key is the sweep's, not a --set of the user's
                text = text.replace(f"--set {key}: ", "")
            raise ConfigError(f"sweep element {index} ({' '.join(extra)}): {text}") from None
        member = SweepMember(name=name, index=index, overrides=dict(combo))
        job = job.model_copy(update={"run": job.run.model_copy(update={"sweep": member})})
        elements.append(Element(index, combo, job))
    return name, elements


def check_membership(element: Element) -> None:
    """A run directory of this name that is not this very element (another sweep's, a run of its own) is refused."""
    run = RunDir.of(element.job)
    if not run.job_json.is_file():
        return
    recorded = run.read_job().run.sweep
    wanted = element.job.run.sweep
    if recorded is not None and wanted is not None and recorded == wanted:
        return
    was = (
        "a run of its own"
        if recorded is None
        else f"element {recorded.index} of sweep {recorded.name} with "
        + (" ".join(f"{k}={v}" for k, v in recorded.overrides.items()) or "no settings")
    )
    raise ConfigError(
        f"{run.path} is {was}, not this sweep's element {element.index} "
        f"({' '.join(f'{k}={v}' for k, v in element.settings)}): resuming it would mix two runs; give the sweep "
        "another run.name (--set run.name=NAME), or move the old directories away"
    )


def pending_elements(elements: Sequence[Element], force: bool) -> tuple[list[Element], list[str]]:
    """The elements to submit (each checked for resuming), and notes on those left out as complete."""
    todo, notes = [], []
    for element in elements:
        check_membership(element)
        check_resume(element.job)
        final = submitting.completed_step(element.job)
        if final is not None and not force:
            notes.append(f"element {element.index} is complete (final checkpoint, step {final}); left out")
            continue
        todo.append(element)
    data = {e.job.data: e.job for e in todo}  # each distinct data setting once
    for job in data.values():
        submitting.check_data(job)
    return todo, notes


def check_array_size(indices: Sequence[int], client: SlurmClient) -> None:
    """Refuse an array whose largest index the controller cannot take (``MaxArraySize``), naming the limit."""
    try:
        limit = client.settings().max_array_size
    except SlurmError as exc:
        log.warning("cannot read MaxArraySize (%s); submitting, sbatch will refuse an array too large", exc)
        return
    if limit is not None and max(indices) >= limit:
        raise ConfigError(
            f"the sweep has {max(indices) + 1} elements but this cluster's MaxArraySize is {limit} (array indices "
            f"0-{limit - 1}): sweep fewer values, or split it with --set run.name=NAME over separate sweeps"
        )


def array_script(
    name: str, root: Path, plans: Sequence[tuple[int, Plan]], max_parallel: int | None, extra: Sequence[Directive]
) -> str:
    shared = shared_request([p.spec.directives for _, p in plans])
    directives = array_directives(shared, name, root, [i for i, _ in plans], max_parallel, extra)
    return render_array(directives, name, [(i, p.job.run.dir) for i, p in plans])


def test_array(script: str, client: SlurmClient) -> None:
    """``sbatch --test-only`` the array: Slurm refuses a request no node could run, before anything is written."""
    with tempfile.TemporaryDirectory(prefix="air-hpc-") as tmp:
        path = Path(tmp) / SCRIPT
        path.write_text(script)
        client.sbatch_test_only(path)


def submit_array(
    name: str,
    todo: Sequence[Element],
    client: SlurmClient,
    *,
    max_parallel: int | None,
    python: str | None,
    extra: Sequence[Directive] = (),
) -> tuple[str, Path]:
    """Render every element, claim each run's owner lock, write the runs, sbatch the array once; the array job id.

    The locks are held until every element's owner names its task (``ARRAY_i``), so a task that starts at once
    waits at its owner fence for that record.
    """
    root = todo[0].job.run.root
    notes: list[str] = []
    version = release(todo[0].job, client, notes)  # asked once: every element's request is the array's
    expedite = expedite_allowed(version, client, notes)
    plans = [(e.index, plan(e.job, None, python=python, version=version, expedite=expedite)) for e in todo]
    script = array_script(name, root, plans, max_parallel, extra)
    check_array_size([i for i, _ in plans], client)
    test_array(script, client)
    path = sweep_dir(root, name) / SCRIPT
    with contextlib.ExitStack() as stack:
        takes = []
        for _, p in plans:
            run = RunDir.of(p.job)
            take = stack.enter_context(
                claim(run, partial(submitting.owner_is_live, client=client), _recorded(run, client))
            )
            takes.append((run, take))
        for _, p in plans:
            submitting.write_run(p)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script)
        job_id = client.sbatch(path, [f"--comment=air-hpc-{uuid.uuid4().hex}"])
        for (index, _), (run, take) in zip(plans, takes, strict=True):
            task = f"{job_id}_{index}"
            record_submission(run, task, "slurm", cluster=client.cluster_name)
            take(task, "slurm")
    log.info("submitted sweep %s as array job %s", name, job_id)
    return job_id, path


def submit_sweep(
    name: str,
    elements: Sequence[Element],
    executor: Executor,
    client: SlurmClient,
    *,
    max_parallel: int | None = None,
    python: str | None = None,
    force: bool = False,
    extra: Sequence[Directive] = (),
    route: RouteDecision | None = None,
) -> SweepSubmission:
    """Check every element, then submit what is not complete: one array (slurm) or a local job each.

    ``route``: the cluster ``sweep --clusters`` chose (``client`` is aimed at it), recorded as a ``route``
    event in every element submitted."""
    if executor == "submitit":
        raise ConfigError("--executor submitit: a sweep runs as our own job array; use --executor slurm (or local)")
    for element in elements:
        make_executor(executor, client).check(element.job)
    if executor == "local" and max_parallel is not None and max_parallel < len(elements):
        raise ConfigError(
            f"--max-parallel {max_parallel}: the local executor starts every element at once ({len(elements)}); "
            "run fewer elements, or use Slurm"
        )
    todo, notes = pending_elements(elements, force)
    root = elements[0].job.run.root
    previous = _previous_job_ids(root, name)
    job_id = None
    if todo and executor == "slurm":
        job_id, _ = submit_array(name, todo, client, max_parallel=max_parallel, python=python, extra=extra)
        if route is not None:
            for element in todo:
                submitting.record_route(RunDir.of(element.job), route, f"{job_id}_{element.index}")
    elif todo:
        for element in todo:
            submitting.submit(element.job, "local", client, python=python, force=force)
    record = SweepRecord(
        name=name,
        root=root,
        executor=executor,
        elements=tuple(SweepElement(e.index, e.job.run.dir, e.settings) for e in elements),
        max_parallel=max_parallel,
        job_ids=(*previous, *([job_id] if job_id else [])),
    )
    write_sweep(record)
    return SweepSubmission(record, tuple(e.index for e in todo), job_id, tuple(notes), route)


def _recorded(run: RunDir, client: SlurmClient) -> Callable[[], list[Owner]]:
    return lambda: recorded_jobs(run, client)


def _previous_job_ids(root: Path, name: str) -> tuple[str, ...]:
    from air_hpc.errors import UserError
    from air_hpc.records.sweeps import read_sweep

    directory = sweep_dir(root, name)
    if not directory.is_dir():
        return ()
    try:
        return read_sweep(directory).job_ids
    except UserError as exc:
        log.warning("%s", exc)
        return ()
