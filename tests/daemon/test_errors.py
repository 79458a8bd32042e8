"""The daemon's exceptions: one base (DaemonError), documented in kliqued/daemon/errors.py."""

from __future__ import annotations

import pytest

from kliqued.daemon import errors
from kliqued.daemon.auth import Principal
from kliqued.daemon.storage.querypool import Busy, Expired
from kliqued.daemon.state.replay import ReplayError
from kliqued.daemon.server import parse_listen
from kliqued.daemon.storage.store import DatabaseLocked


def test_every_daemon_exception_is_a_daemon_error_importable_where_it_was() -> None:
    for cls in (
        Busy,
        Expired,
        ReplayError,
        DatabaseLocked,
        errors.ApiError,
        errors.Unavailable,
        errors.BadOption,
    ):
        assert issubclass(cls, errors.DaemonError), cls
        assert getattr(errors, cls.__name__) is cls


def test_a_bad_listen_address_is_a_bad_option_with_its_message() -> None:
    with pytest.raises(errors.BadOption, match="--listen must be HOST:PORT") as info:
        parse_listen("8080")
    assert isinstance(info.value, ValueError)
    assert parse_listen("[::1]:8080") == ("::1", 8080)


def test_a_principal_is_parsed_to_its_kind() -> None:
    assert Principal.parse("role:admin", "t1").kind == "role"
    assert Principal.parse("user:alice").name == "alice"
    for bad in ("alice", "group:x", "user:", "role:root"):
        with pytest.raises(ValueError):
            Principal.parse(bad)
