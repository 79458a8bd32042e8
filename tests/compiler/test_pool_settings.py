"""A pool's settings (issue 25, item 10): a key no executor of the pool's kind reads is a
warning at the key (a typo must not pass silently), one meant for another scheduler than
the pool's ``scheduler`` too; a value that could never work is an error at the value."""

from __future__ import annotations

from tests.harness.typed import present

from .helpers import MINIMAL, compile_text

ONPREM = "  - {name: onprem, kind: baremetal, capacity: 8, gpu_type: h100}\n"


def with_pool(kind: str, settings: str) -> str:
    return MINIMAL.replace(
        ONPREM,
        f"  - name: onprem\n    kind: {kind}\n    capacity: 8\n"
        f"    gpu_type: h100\n    settings:\n{settings}",
    )


def test_the_settings_each_executor_reads_compile_without_a_word() -> None:
    for kind, settings in [
        (
            "hpc",
            "      scheduler: slurm\n      partition: gpu\n      account: nw-1\n      qos: high\n",
        ),
        ("hpc", "      scheduler: pbs\n      queue: gpu\n      account: nw\n"),
        (
            "kubernetes",
            "      namespace: klique-work\n      runtime_class: nvidia\n"
            "      label.example.com/team: vision\n",
        ),
        ("baremetal", "      mode: docker\n      master_port: '29600'\n"),
    ]:
        r = compile_text(with_pool(kind, settings))
        assert r.ok and not r.diagnostics, [d.render() for d in r.diagnostics]
        assert present(present(r.estate).pool("onprem")).settings  # compiled as given


def test_a_key_no_executor_reads_is_a_warning_naming_the_known_ones() -> None:
    r = compile_text(
        with_pool("hpc", "      scheduler: slurm\n      acount: nw\n      queue: gpu\n")
    )
    assert r.ok
    got = {
        d.message.rsplit(".", 1)[1]: d for d in r.diagnostics if d.code == "pool-setting-unknown"
    }
    assert sorted(got) == ["acount", "queue"]  # slurm has partitions, not queues
    assert got["acount"].severity.value == "warning" and present(got["acount"].pos).line == 8
    assert "account, master_port, partition, qos, scheduler" in (got["acount"].hint or "")


def test_a_value_that_cannot_work_is_an_error_at_its_line() -> None:
    for settings, words in [
        ("      account: northwind klique\n", "account must be one word"),
        ("      partition: --wrap=id\n", "partition must be one word"),
        ("      scheduler: condor\n", "scheduler must be one of slurm, pbs, lsf"),
    ]:
        r = compile_text(with_pool("hpc", settings))
        assert not r.ok
        d = next(d for d in r.diagnostics if d.code == "pool-setting")
        assert words in d.message and d.pos is not None and d.pos.line == 7, d.render()
    r = compile_text(with_pool("kubernetes", "      namespace: Klique_Work\n"))
    assert [d.code for d in r.diagnostics] == ["pool-setting"]
