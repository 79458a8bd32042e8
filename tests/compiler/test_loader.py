"""Untrusted input: each bad file gets a clear error with its place, never a traceback."""

from __future__ import annotations

from compiler.api import SourceFile, compile_files
from compiler.loader import MAX_FILE_BYTES, load_yaml
from tests.harness.typed import present

from .helpers import MINIMAL, codes


def _bomb(levels: int = 9) -> bytes:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return ("\n".join(lines) + "\n").encode()


def test_alias_bomb_is_refused_quickly() -> None:
    result = compile_files([SourceFile("bomb.yaml", _bomb())])
    assert codes(result) == ["yaml-alias-limit"]
    assert result.estate is None


def test_small_aliases_are_fine() -> None:
    text = MINIMAL.replace("groups:", "x-labels: &l {country: de}\ngroups:")
    # an unknown section is an error, but the alias itself is not the problem
    result = compile_files([SourceFile("e.yaml", text.encode())])
    assert "yaml-alias-limit" not in codes(result)
    shared = (
        "pools:\n  - &p {name: a, kind: baremetal, capacity: 8, gpu_type: h100}\n"
        "profiles:\n  - {name: x, gpus: 1, pools: [a], policies: [t]}\n"
        "policies:\n  - {name: t, group: t, limit: 8}\n"
        "groups:\n  - {name: t}\n"
        "pricing:\n  - {gpu_type: h100, per_gpu_hour: 1, effective_from: '2026-01-01T00:00:00Z'}\n"
    )
    assert compile_files([SourceFile("e.yaml", shared.encode())]).ok


def test_recursive_alias_does_not_hang() -> None:
    loaded = load_yaml("r.yaml", b"a: &x [1, *x]\n")
    assert loaded.root is None or loaded.diagnostics or loaded.root["a"][1] is None


def test_file_over_ten_mib_is_refused_before_parsing() -> None:
    data = b"# " + b"x" * (MAX_FILE_BYTES) + b"\n"
    loaded = load_yaml("big.yaml", data)
    assert [d.code for d in loaded.diagnostics] == ["yaml-too-large"]
    assert "10 MiB" in loaded.diagnostics[0].message


def test_non_utf8_names_line_and_column() -> None:
    loaded = load_yaml("l.yaml", b"pools:\n  - name: caf\xe9\n")
    d = loaded.diagnostics[0]
    assert d.code == "yaml-encoding" and (present(d.pos).line, present(d.pos).col) == (2, 14)


def test_utf8_bom_is_accepted() -> None:
    assert load_yaml("b.yaml", b"\xef\xbb\xbfversion: 1\n").ok


def test_tab_indentation_is_named() -> None:
    loaded = load_yaml("t.yaml", b"pools:\n  - name: a\n\t  kind: hpc\n")
    assert [(d.code, present(d.pos).line) for d in loaded.diagnostics] == [("yaml-tab", 3)]


def test_tab_inside_a_value_is_not_indentation() -> None:
    assert load_yaml("t.yaml", b"a: 'x\ty'\n").ok


def test_duplicate_key_names_both_places() -> None:
    loaded = load_yaml("d.yaml", b"pools:\n  - name: a\n    name: b\n")
    d = loaded.diagnostics[0]
    assert d.pos is not None
    assert d.code == "yaml-duplicate-key" and d.pos.line == 3 and "d.yaml:2" in (d.hint or "")


def test_errors_from_several_files_are_all_reported() -> None:
    files = [
        SourceFile("a.yaml", b"pools: [\n"),
        SourceFile("b.yaml", b"pools:\n  - {name: x, kind: nope, capacity: 1, gpu_type: h}\n"),
        SourceFile("c.yaml", MINIMAL.encode()),
    ]
    result = compile_files(files)
    assert {present(d.pos).file for d in result.errors} == {"a.yaml", "b.yaml"}
    assert result.estate is None


def test_top_level_not_a_mapping() -> None:
    result = compile_files([SourceFile("l.yaml", b"- a\n- b\n")])
    assert codes(result) == ["invalid-value"]


def test_empty_file_is_fine() -> None:
    result = compile_files([SourceFile("empty.yaml", b""), SourceFile("m.yaml", MINIMAL.encode())])
    assert result.ok


def test_a_file_that_does_not_parse_causes_no_false_reference_errors() -> None:
    groups_broken = SourceFile("groups.yaml", b"groups:\n  - {name: team-a\n")
    rest = MINIMAL.split("groups:")[0] + "pricing:" + MINIMAL.split("pricing:")[1]
    result = compile_files([groups_broken, SourceFile("rest.yaml", rest.encode())])
    assert codes(result) == ["yaml-syntax"]


def test_an_invalid_profile_is_not_reported_again_as_unknown() -> None:
    text = MINIMAL.replace(
        "capacity: 8, gpu_type: h100}", "capacity: 8, gpu_type: h100, execution_order: [gpu1]}"
    )
    text = text.replace("gpus: 1,", 'gpus: "1",')
    result = compile_files([SourceFile("e.yaml", text.encode())])
    assert codes(result) == ["invalid-value"]
