"""The one Slurm request: the batch script's ``#SBATCH`` lines and submitit's script ask Slurm for the same thing.

Both scripts are read back the way sbatch reads them (``get_argument`` in ``src/sbatch/opt.c``:
single or double quotes group, a backslash escapes the next character even inside quotes, an
unquoted ``#`` starts a comment), so a quoting slip on either side shows as a different value.
"""

from pathlib import Path

import pytest
import submitit

from air_hpc.config import JobConfig, load_job
from air_hpc.errors import ConfigError
from air_hpc.launch.executors import SUBMITIT_DECIDES, make_executor, submitit_slurm_parameters
from air_hpc.launch.plan import Plan
from air_hpc.records.rundir import RunDir
from air_hpc.render import NodeRequest, build_spec, render_script
from air_hpc.render.directives import Directive, slurm_directives
from air_hpc.slurm.cluster import parse_minutes
from air_hpc.slurm.fake import FakeSlurm
from tests.conftest import RunMain
from tests.unit.test_render import FIXED, PYTHON, TESTBED_JOB, VARIANTS

LOCAL_JOB = TESTBED_JOB.parent / "gpt-tiny-local.yaml"
#: What submitit writes whatever it is given: its logs, and its own accounting key.
SUBMITIT_WRITES = frozenset({"output", "error", "wckey"})

HOSTILE_VALUES = [
    'run.name=it\'s a "job" #1 $(id) `id`',
    "cluster.reservation=maint window",
    "cluster.constraint=ib&nvme|[a*2]",
    "cluster.account=team\\lab",
]


def sbatch_argument(text: str) -> tuple[str, str]:
    """One ``#SBATCH`` line's first argument as sbatch reads it, and what is left of the line."""
    out, quote, i = [], "", 0
    text = text.lstrip()
    while i < len(text) and (quote or not text[i].isspace()):
        char = text[i]
        if char == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
            continue
        if quote and char == quote:
            quote = ""
        elif not quote and char in "\"'":
            quote = char
        elif not quote and char == "#":
            break
        else:
            out.append(char)
        i += 1
    assert not quote, f"unmatched {quote} in {text!r}"
    return "".join(out), text[i:]


def sbatch_options(script: str) -> dict[str, str | None]:
    """``--option[=value]`` of every ``#SBATCH`` line before the first command, as sbatch reads them."""
    found: dict[str, str | None] = {}
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            argument, _ = sbatch_argument(line[len("#SBATCH") :])
            option, equals, value = argument.removeprefix("--").partition("=")
            assert option not in found, f"--{option} twice"
            found[option] = value if equals else None
    return found


def plan_for(job: JobConfig, request: NodeRequest | None = None) -> Plan:
    spec = build_spec(job, request, python=PYTHON)
    return Plan(job, spec.request, spec, render_script(spec))


def submitit_script(plan: Plan, folder: Path) -> str:
    """The script submitit itself would hand to sbatch for this plan."""
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(**submitit_slurm_parameters(plan, RunDir(folder)))
    return executor._make_submission_file_text(executor._submitit_command_str, "uid")


CASES = {
    "testbed": ([], None),
    "hostile": (HOSTILE_VALUES, NodeRequest(switches=1, exclude="n[7-8]")),
    **{name: (overrides, request) for name, (overrides, request) in VARIANTS.items() if name != "hot-spares"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_submitit_asks_slurm_for_what_the_batch_script_asks(name: str, tmp_path: Path) -> None:
    overrides, request = CASES[name]
    overrides = [o for o in overrides if not o.startswith(("container.", "cluster.python"))]
    plan = plan_for(load_job(TESTBED_JOB, [*FIXED, *overrides]), request)
    ours = sbatch_options(plan.script)
    theirs = sbatch_options(submitit_script(plan, tmp_path))
    assert set(ours) - SUBMITIT_DECIDES == set(theirs) - SUBMITIT_WRITES
    for option in set(ours) - SUBMITIT_DECIDES:
        mine, submitits = ours[option], theirs[option]
        if option == "signal":
            assert mine == f"B:{submitits}", "the same signal and lead, to the tasks instead of the batch shell"
        elif option == "time":
            assert parse_minutes(mine or "") == parse_minutes(submitits or "")
        else:
            assert mine == submitits, option


def test_the_script_writes_each_directive_as_sbatch_reads_it_back() -> None:
    job = load_job(TESTBED_JOB, [*FIXED, *HOSTILE_VALUES])
    directives = slurm_directives(job)
    script = render_script(build_spec(job, python=PYTHON))
    assert sbatch_options(script) == {d.option: d.value for d in directives}
    assert sbatch_options(script)["job-name"] == 'it\'s a "job" #1 $(id) `id`'
    assert sbatch_options(script)["account"] == "team\\lab"


@pytest.mark.parametrize("key", ["run.name", "run.root"])
def test_a_run_directory_with_a_backslash_is_refused_by_its_key(key: str) -> None:
    """Slurm drops a backslash from a log path and stops expanding %j there: the batch log would go astray."""
    value = "team\\lab" if key == "run.name" else "/shared/runs\\x"
    job = load_job(TESTBED_JOB, [*FIXED, f"{key}={value}"])
    with pytest.raises(ConfigError, match=rf"^{key}: .* holds a backslash, which Slurm drops from a log path"):
        slurm_directives(job)


def test_spares_ask_for_more_nodes_and_no_kill() -> None:
    options = {d.option: d.value for d in slurm_directives(load_job(TESTBED_JOB, [*FIXED, "resources.spare_nodes=1"]))}
    assert options["nodes"] == "3" and "no-kill" in options and options["no-kill"] is None


def test_a_directive_is_checked_once_when_made_naming_its_key() -> None:
    with pytest.raises(ConfigError, match=r"^cluster\.qos: .* contains a newline"):
        Directive("qos", "a\nb", "cluster.qos")
    assert Directive("exclusive", None, "cluster.exclusive").argument == "--exclusive"
    assert Directive("reservation", "a b", "cluster.reservation").argument == '--reservation="a b"'


@pytest.mark.parametrize("executor", ["submitit", "local"])
def test_spares_under_submitit_or_local_are_refused_naming_the_key(executor: str) -> None:
    job = load_job(LOCAL_JOB, [*FIXED, "resources.spare_nodes=1"])
    with pytest.raises(ConfigError, match=rf"^resources\.spare_nodes: the {executor} executor cannot keep hot spares"):
        make_executor(executor, FakeSlurm()).check(job)  # type: ignore[arg-type]
    make_executor("slurm", FakeSlurm()).check(job)


@pytest.mark.parametrize("executor", ["submitit", "local"])
def test_a_container_under_submitit_or_local_is_refused_naming_the_key(executor: str) -> None:
    job = load_job(LOCAL_JOB, [*FIXED, "container.image=nvcr.io/nvidia/pytorch:25.01-py3"])
    with pytest.raises(ConfigError, match=rf"^container\.image: the {executor} executor starts its own step"):
        make_executor(executor, FakeSlurm()).check(job)  # type: ignore[arg-type]


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_cli_refuses_spares_under_submitit_in_one_line_exit_2(
    dry_run: list[str], tmp_path: Path, run_main: RunMain
) -> None:
    args = ["submit", str(TESTBED_JOB), "--executor", "submitit", "--set", "resources.spare_nodes=1"]
    code, out, err = run_main([*args, "--set", f"run.root={tmp_path}", *dry_run])
    assert (code, out) == (2, "")
    assert err.startswith("error: resources.spare_nodes: the submitit executor cannot keep hot spares")
    assert err.count("\n") == 1 and not (tmp_path / "gpt-tiny-testbed").exists()
