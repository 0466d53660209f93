"""The testbed's tenants: the sacctmgr plan (pure, converging), the slurm.conf they need, and bad options."""

from pathlib import Path

import pytest

from air_hpc.errors import TestbedError
from air_hpc.testbed import Testbed, conf, tenants
from air_hpc.testbed.tenants import Existing, node_quota, parse_existing, plan, unknown_to_controller
from tests.conftest import RunMain


def adds(steps: list[list[str]]) -> list[list[str]]:
    return [s for s in steps if s[0] == "add"]


def test_a_fresh_database_gets_three_qos_tiers_three_accounts_and_their_users() -> None:
    steps = plan(Existing(), nodes=8, owner="root", grace_s=30)
    assert [s[2] for s in adds(steps) if s[1] == "qos"] == ["high", "normal", "scavenger"]
    assert [s[2] for s in adds(steps) if s[1] == "account"] == ["research", "product", "ops"]
    users = {(s[3].removeprefix("Account="), s[2]) for s in adds(steps) if s[1] == "user"}
    assert {("research", "root"), ("product", "root"), ("ops", "root")} <= users, "the running user submits for all"
    assert ("product", "nobody") in users and ("research", "alice") in users
    quota = {s[3].removeprefix("name="): s for s in steps if s[:2] == ["modify", "account"]}
    assert "GrpTRES=node=6" in quota["research"] and "GrpTRES=node=4" in quota["product"]
    assert "GrpTRES=node=2" in quota["ops"] and "Fairshare=50" in quota["research"]
    assert all("QOS=high,normal,scavenger" in s and "DefaultQOS=normal" in s for s in quota.values())
    qos = {s[3].removeprefix("name="): s for s in steps if s[:2] == ["modify", "qos"]}
    assert "Preempt=scavenger" in qos["high"] and "Preempt=" in qos["normal"]
    assert {"GraceTime=30", "PreemptMode=requeue", "UsageFactor=0"} <= set(qos["scavenger"])


def test_a_database_that_has_them_gets_no_add_only_the_settings_again() -> None:
    first = plan(Existing(), nodes=4, owner="root", grace_s=10)
    existing = Existing(
        qos=frozenset({"normal", "high", "scavenger"}),
        accounts=frozenset({"root", "research", "product", "ops"}),
        users=frozenset((s[3].removeprefix("Account="), s[2]) for s in adds(first) if s[1] == "user"),
    )
    again = plan(existing, nodes=4, owner="root", grace_s=10)
    assert adds(again) == []
    assert again == [s for s in first if s[0] == "modify"]


def test_quotas_follow_the_testbed_size_and_hold_one_two_node_run() -> None:
    research, product, ops = tenants.TENANTS
    assert [node_quota(t, 8) for t in (research, product, ops)] == [6, 4, 2]
    assert [node_quota(t, 4) for t in (research, product, ops)] == [3, 2, 2]
    assert node_quota(research, 1) == 1, "never more than the testbed has"


def test_sacctmgr_listings_and_the_controllers_associations_are_read() -> None:
    existing = parse_existing("normal\nhigh\n", "root\nresearch\n", "root|\nroot|root\nresearch|alice\n\n")
    assert existing.qos == {"normal", "high"} and existing.accounts == {"root", "research"}
    assert existing.users == {("root", "root"), ("research", "alice")}
    shown = (
        "ClusterName=airtb Account=research UserName=root(0) Partition= Priority=0 ID=5\n"
        "ClusterName=airtb Account=ops UserName=root(0) Partition= Priority=0 ID=9\n"
        "ClusterName=airtb Account=product UserName=alice(4294967294) Partition= Priority=0 ID=7\n"
    )
    assert unknown_to_controller(shown, "root") == ["product"]


def test_tenants_enforce_limits_with_multifactor_priority_and_preempt_by_qos(tmp_path: Path) -> None:
    layout = conf.Layout(tmp_path)
    ports = conf.Ports(slurmctld=7001, slurmdbd=7002, mariadb=7003, slurmd=(7011,))
    plain = conf.slurm_conf(layout, ports, ["n1"], "vm", "airtb")
    assert "AccountingStorageEnforce" not in plain and "PreemptType=preempt/partition_prio" in plain
    text = conf.slurm_conf(layout, ports, ["n1"], "vm", "airtb", conf.Settings(tenants=True, preempt_by="qos"))
    assert "AccountingStorageEnforce=associations,limits,qos" in text
    assert "PriorityType=priority/multifactor" in text and "PriorityWeightFairshare=10000" in text
    assert "PreemptType=preempt/qos" in text and "PreemptMode=REQUEUE" in text
    partition = conf.slurm_conf(layout, ports, ["n1"], "vm", "airtb", conf.Settings(tenants=True))
    assert "PreemptType=preempt/partition_prio" in partition, "tenants keep partition preemption when asked"


def test_preempting_by_qos_without_tenants_is_refused(tmp_path: Path, run_main: RunMain) -> None:
    code, out, err = run_main(["testbed", "up", "--state-dir", str(tmp_path / "tb"), "--preempt-by", "qos"])
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == ["error: --preempt-by qos: preemption by QOS needs the QOS tiers of --tenants"]
    with pytest.raises(TestbedError, match="needs the QOS tiers"):
        Testbed(tmp_path / "tb").up((1,), settings=conf.Settings(preempt_by="qos"))
