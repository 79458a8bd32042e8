"""Session idle limits per profile (issue 14, sessions): compiled into the profile in seconds,
left out of the revision when absent, checked with positions."""

from __future__ import annotations

from tests.harness.typed import present

from .helpers import MINIMAL, compile_text

NB = "  - name: nb\n    gpus: 1\n    pools: [onprem]\n    policies: [team-a]\n"
IDLE_LINE = 8  # the line of `idle:` in with_idle's estate


def with_idle(idle: str) -> str:
    return MINIMAL.replace("profiles:\n", "profiles:\n" + NB + idle)


def test_idle_limits_compile_to_seconds_and_leave_other_revisions_alone() -> None:
    r = compile_text(with_idle("    idle: {wall: 8h, cpu: 30m, network: 900}\n"))
    assert r.ok, [d.render() for d in r.diagnostics]
    nb = present(present(r.estate).profile("nb"))
    assert nb.idle is not None
    assert (nb.idle.wall_s, nb.idle.cpu_s, nb.idle.gpu_s, nb.idle.network_s) == (
        28800,
        1800,
        None,
        900,
    )
    assert present(present(r.estate).profile("gpu1")).idle is None
    plain = compile_text(MINIMAL)
    assert '"idle"' not in present(plain.estate).canonical_json()


def test_an_idle_limit_of_zero_is_an_error_at_its_line() -> None:
    r = compile_text(with_idle("    idle:\n      wall: 8h\n      cpu: 0s\n"))
    assert not r.ok
    d = next(d for d in r.diagnostics if d.code == "idle-limit")
    assert "idle.cpu is 0" in d.message and "profile 'nb'" in d.message
    assert d.pos is not None and d.pos.line == IDLE_LINE + 2


def test_a_limit_not_shorter_than_wall_is_a_warning_at_its_line() -> None:
    r = compile_text(with_idle("    idle:\n      wall: 1h\n      gpu: 2h\n"))
    assert r.ok
    d = next(d for d in r.diagnostics if d.code == "idle-limit-unreachable")
    assert d.severity.value == "warning"
    assert "idle.gpu (2h) is not shorter than idle.wall (1h)" in d.message
    assert d.pos is not None and d.pos.line == IDLE_LINE + 2


def test_an_unknown_idle_kind_and_a_bad_duration_are_refused_at_their_place() -> None:
    r = compile_text(with_idle("    idle: {disk: 1h}\n"))
    assert not r.ok and any("disk" in d.message for d in r.diagnostics)
    r = compile_text(with_idle("    idle: {cpu: soon}\n"))
    assert not r.ok
    d = next(d for d in r.diagnostics if "cpu" in (d.message + str(d.pos)))
    assert d.pos is not None and d.pos.line == IDLE_LINE
