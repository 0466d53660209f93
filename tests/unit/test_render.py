"""Batch script rendering: goldens for every example job, shellcheck, quoting, env per profile.

Regenerate goldens after an intended template change with
``AIR_HPC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_render.py`` and review the diff.
"""

import os
import subprocess
from pathlib import Path

import pytest

from air_hpc.config import JobConfig, load_job
from air_hpc.errors import ConfigError
from air_hpc.launch.plan import node_request
from air_hpc.render import NodeRequest, build_spec, job_environment, render_script
from air_hpc.render.directives import slurm_directives
from air_hpc.render.quoting import sbatch_value, shell_quote

REPO = Path(__file__).resolve().parents[2]
JOBS = sorted((REPO / "configs" / "jobs").glob("*.yaml"))
GOLDEN = REPO / "tests" / "data" / "golden"
TESTBED_JOB = REPO / "configs" / "jobs" / "gpt-tiny-testbed.yaml"
#: machine-independent paths for goldens
FIXED = ["run.root=/shared/runs", "data.path=/shared/data/corpus.h5"]
PYTHON = "/opt/air-hpc/bin/python"
HOSTILE = [
    'x"; touch pwned; echo "',
    "$(touch pwned)",
    "`touch pwned`",
    "a;touch pwned",
    "it's \\ a 'quote'",
    "line1; touch pwned",
    "=starts-with-equals",
    "",
]

#: extra golden cases beyond the example jobs: GPU profile, pinned rank order, container, --switches, hot spares
VARIANTS: dict[str, tuple[list[str], NodeRequest]] = {
    "h100-pinned-container": (
        [
            "hardware=h100-sxm",
            "resources.tasks_per_node=8",
            "resources.mem_gb=900",
            "parallel.tp=4",
            "parallel.pp=2",
            "train.global_batch_size=64",
            "cluster.account=ml-team",
            "cluster.qos=high",
            "cluster.exclusive=true",
            "container.image=nvcr.io/nvidia/pytorch:25.01-py3",
            "cluster.python=/shared/air-hpc/bin/python",  # the host's, beside the batch shell (else this one's)
            "env.NCCL_DEBUG=WARN",
        ],
        NodeRequest(nodelist="gpu[07-08]", rank_hosts=("gpu08",) * 8 + ("gpu07",) * 8, exclude="gpu03"),
    ),
    "hot-spares": (
        ["resources.spare_nodes=1"],
        NodeRequest(nodelist="n[3-5]", rank_hosts=("n3", "n3", "n4", "n4"), spares=("n5",)),
    ),
    "switches-reservation": (
        ["cluster.reservation=maint window", "cluster.constraint=ib&nvme", "resilience.signal=USR1"],
        NodeRequest(switches=1),
    ),
}


#: a block job with segments of one TP group and two hot spares, rendered under each release's rules: 26.05 pins
#: the nodes beside --segment, 25.05 refuses that and lets Slurm place the segments, 23.11 has no --segment
BLOCK_RELEASES = {
    "block-spares-23.11": "23.11.10",
    "block-spares-25.05": "25.05.8",
    "block-spares-26.05": "26.05.3",
}
BLOCK_JOB = [
    f"cluster.topology_file={REPO / 'tests' / 'data' / 'topology' / 'blocks-4x4.conf'}",
    "resources.nodes=4",
    "resources.tasks_per_node=1",
    "resources.spare_nodes=2",
    "parallel.tp=2",
    "parallel.pp=2",
    "hardware.nvlink_domain_nodes=4",
]


def render_for(overrides: list[str], request: NodeRequest | None = None, job_file: Path = TESTBED_JOB) -> str:
    job = load_job(job_file, [*FIXED, *overrides])
    return render_script(build_spec(job, request, python=PYTHON))


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("AIR_HPC_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with AIR_HPC_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text()


@pytest.mark.parametrize("job_file", JOBS, ids=lambda p: p.stem)
def test_example_jobs_match_golden(job_file: Path) -> None:
    # The batch shell's own Python, outside any container: unset, it is the one running the tests.
    check_golden(job_file.stem, render_for(["cluster.python=/shared/air-hpc/bin/python"], job_file=job_file))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_match_golden(name: str) -> None:
    overrides, request = VARIANTS[name]
    check_golden(name, render_for(overrides, request))


@pytest.mark.parametrize("name", sorted(BLOCK_RELEASES))
def test_block_jobs_per_release_match_golden(name: str) -> None:
    job = load_job(TESTBED_JOB, [*FIXED, *BLOCK_JOB, f"cluster.slurm_version={BLOCK_RELEASES[name]}"])
    request, _ = node_request(job)
    check_golden(name, render_script(build_spec(job, request, python=PYTHON)))


def test_every_golden_has_a_source() -> None:
    sources = {p.stem for p in JOBS} | set(VARIANTS) | set(BLOCK_RELEASES)
    assert {p.stem for p in GOLDEN.glob("*.sbatch")} == sources


def test_every_golden_passes_shellcheck() -> None:
    goldens = sorted(GOLDEN.glob("*.sbatch"))
    assert goldens
    result = subprocess.run(["shellcheck", "--shell=bash", *map(str, goldens)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_hostile_values_pass_shellcheck(tmp_path: Path) -> None:
    job = load_job(TESTBED_JOB, [*FIXED, f"run.name={HOSTILE[0]}"])
    job = job.model_copy(update={"env": {f"V{i}": v for i, v in enumerate(HOSTILE)}})
    script = tmp_path / "job.sbatch"
    script.write_text(render_script(build_spec(job, python=PYTHON)))
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_render_is_deterministic_and_env_sorted() -> None:
    job = load_job(TESTBED_JOB, FIXED)
    a = job.model_copy(update={"env": {"ZED": "1", "ALPHA": "2", "MID": "3"}})
    b = job.model_copy(update={"env": {"MID": "3", "ALPHA": "2", "ZED": "1"}})
    text_a = render_script(build_spec(a, python=PYTHON))
    assert text_a == render_script(build_spec(b, python=PYTHON))
    exports = [line.split("=")[0] for line in text_a.splitlines() if line.startswith("export ") and "=" in line]
    env_names = [name for name in exports if name.removeprefix("export ") in {"ZED", "ALPHA", "MID", "OMP_NUM_THREADS"}]
    assert env_names == sorted(env_names)


def env_section(script: str) -> str:
    start = script.index("# >>> environment\n")
    end = script.index("# <<< environment\n")
    return script[start:end]


def test_env_values_round_trip_through_bash(tmp_path: Path) -> None:
    job = load_job(TESTBED_JOB, FIXED)
    values = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    job = job.model_copy(update={"env": values})
    section = tmp_path / "env.sh"
    section.write_text(env_section(render_script(build_spec(job, python=PYTHON))))
    probe = 'source "$1"; for n in ' + " ".join(values) + '; do printf "%s\\0" "${!n}"; done'
    out = subprocess.run(["bash", "-c", probe, "probe", str(section)], cwd=tmp_path, capture_output=True, check=True)
    assert out.stdout.decode().split("\0")[:-1] == list(values.values())
    assert not (tmp_path / "pwned").exists()


def test_hostile_run_name_executes_nothing(tmp_path: Path) -> None:
    """The issue's acceptance case, through the CLI: `bash -n` and sourcing the env run nothing."""
    out = tmp_path / "job.sbatch"
    subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "air-hpc"),
            "render",
            str(TESTBED_JOB),
            "--set",
            'run.name=x"; touch pwned; echo "',
            "--set",
            f"run.root={tmp_path}",
            "-o",
            str(out),
        ],
        check=True,
        cwd=tmp_path,
    )
    script = out.read_text()
    subprocess.run(["bash", "-n", str(out)], check=True, cwd=tmp_path)
    (tmp_path / "env.sh").write_text(env_section(script) + "printf '%s' \"$OMP_NUM_THREADS\"\n")
    sourced = subprocess.run(["bash", "-c", "source ./env.sh"], cwd=tmp_path, capture_output=True, text=True)
    assert sourced.stdout == "1"
    assert "readonly run_dir=" + shell_quote(str(tmp_path / 'x"; touch pwned; echo "')) in script
    assert '#SBATCH --job-name="x\\"; touch pwned; echo \\""' in script
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("plain-name_1", "plain-name_1"),
        ("n[1-4],gpu07", "n[1-4],gpu07"),
        ("two words", '"two words"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a#b", '"a\\#b"'),
        ("back\\slash", '"back\\\\slash"'),
        ("$(touch x)", '"$(touch x)"'),
    ],
)
def test_sbatch_value_encoding(value: str, encoded: str) -> None:
    assert sbatch_value(value, "run.name") == encoded


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "nul\x00", "x" * 5000])
def test_sbatch_value_rejects_what_sbatch_cannot_read(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^cluster\.partition: "):
        sbatch_value(bad, "cluster.partition")


def test_newline_in_job_name_is_a_config_error_naming_the_key() -> None:
    job = load_job(TESTBED_JOB, FIXED)
    job = job.model_copy(update={"run": job.run.model_copy(update={"name": "a\nb"})})
    with pytest.raises(ConfigError, match=r"^run\.name: .*newline"):
        render_script(build_spec(job, python=PYTHON))


def test_newline_in_partition_names_the_key() -> None:
    job = load_job(TESTBED_JOB, FIXED)
    job = job.model_copy(update={"cluster": job.cluster.model_copy(update={"partition": "debug\n#SBATCH --x"})})
    with pytest.raises(ConfigError, match=r"^cluster\.partition: "):
        render_script(build_spec(job, python=PYTHON))


def test_bad_env_name_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^env\.BAD-NAME: "):
        job_environment(load_job(TESTBED_JOB, [*FIXED, "env.BAD-NAME=1"]))


def test_container_mount_with_comma_is_rejected() -> None:
    job = load_job(TESTBED_JOB, [*FIXED, "container.image=img"])
    job = job.model_copy(update={"container": job.container.model_copy(update={"mounts": ("/a,/b:/c",)})})  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"^container\.mounts: "):
        build_spec(job, python=PYTHON)


def h100(*extra: str) -> JobConfig:
    return load_job(
        TESTBED_JOB, [*FIXED, "hardware=h100-sxm", "resources.tasks_per_node=8", "train.global_batch_size=64", *extra]
    )


def test_env_from_gpu_profile() -> None:
    env = job_environment(h100("parallel.tp=2", "parallel.pp=1"))
    assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"
    assert env["NCCL_SOCKET_IFNAME"] == "=bond0"
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["OMP_NUM_THREADS"] == "1"


def test_no_cuda_max_connections_without_tp() -> None:
    env = job_environment(h100("parallel.tp=1", "parallel.pp=2"))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in env


def test_cpus_per_task_is_the_nodes_cores_over_its_ranks_unless_set() -> None:
    """112 cores over 8 ranks on an H100 node, not 1 core for a rank that feeds a GPU (issue 24 item 10)."""
    derived = h100()
    assert derived.resources.cpus_per_task is None
    assert derived.cpus_per_task == 14
    directives = slurm_directives(derived, None)
    assert [d.value for d in directives if d.option == "cpus-per-task"] == ["14"]
    assert h100("resources.cpus_per_task=6").cpus_per_task == 6
    assert load_job(TESTBED_JOB, FIXED).cpus_per_task == 1  # 2 cores over 2 ranks


def test_cpu_profile_sets_no_nccl() -> None:
    job = load_job(TESTBED_JOB, [*FIXED, "resources.cpus_per_task=2"])
    env = job_environment(job.model_copy(update={"env": {}}))
    assert not [k for k in env if k.startswith(("NCCL_", "CUDA_", "TORCH_NCCL"))]
    assert env["OMP_NUM_THREADS"] == "2"


def test_user_env_wins_over_profile() -> None:
    env = job_environment(h100("parallel.tp=2", "env.NCCL_IB_TIMEOUT=18", "env.CUDA_DEVICE_MAX_CONNECTIONS=8"))
    assert env["NCCL_IB_TIMEOUT"] == "18"
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"


def test_user_master_port_is_not_overridden() -> None:
    text = render_for(["env.MASTER_PORT=29500"])
    assert "export MASTER_PORT=29500" in text
    assert "--master" not in text and "export MASTER_ADDR MASTER_PORT" not in text


def test_rank_order_goes_to_hostfile_and_arbitrary_distribution() -> None:
    text = render_for([], NodeRequest(nodelist="n[3-4]", rank_hosts=("n4", "n4", "n3", "n3")))
    assert "#SBATCH --nodelist=n[3-4]" in text
    assert "--distribution=arbitrary" in text and "--ntasks-per-node=2 --cpus" not in text
    assert 'start "$run_dir" --master \\\n    --rank-hosts n4 n4 n3 n3) ||' in text
    # The batch shell itself writes nothing before the helper's owner fence, and the rank order is per start.
    assert text.index("helper start") < text.index('export SLURM_HOSTFILE="$generation_dir"/hostfile')
    assert '>"$' not in text[: text.index("helper start")]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (NodeRequest(nodelist="n[1-2]", rank_hosts=("n1",) * 3), "rank order has 3 ranks"),
        (NodeRequest(nodelist="n[1-2]", rank_hosts=("n1", "n1", "n1", "n2")), "2 ranks on each of 2 nodes"),
        (NodeRequest(nodelist="n[1-2]", rank_hosts=("n1", "n1", "n3", "n3")), "differ from the pinned nodes"),
        (NodeRequest(rank_hosts=("n1", "n1", "n2", "n2")), "needs pinned nodes"),
        (NodeRequest(nodelist="n[1-3]"), "does not have resources.nodes = 2"),
        (NodeRequest(switches=3), "between 1 and 2"),
    ],
)
def test_inconsistent_node_requests_are_rejected(request_: NodeRequest, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_spec(load_job(TESTBED_JOB, FIXED), request_, python=PYTHON)


def test_switches_wait_comes_from_placement_config() -> None:
    text = render_for(["placement.switches_wait_min=90"], NodeRequest(switches=1))
    assert "#SBATCH --switches=1@01:30:00" in text


def test_python_defaults_to_cluster_then_container() -> None:
    job = load_job(TESTBED_JOB, [*FIXED, "cluster.python=/venv/bin/python3"])
    assert build_spec(job).step_command[0] == "/venv/bin/python3"
    job = load_job(TESTBED_JOB, [*FIXED, "container.image=img", "container.python=/usr/bin/python"])
    assert build_spec(job).step_command[0] == "/usr/bin/python"
