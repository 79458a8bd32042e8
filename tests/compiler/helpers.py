"""Small builders for test estates."""

from __future__ import annotations

from compiler.api import CompileResult, SourceFile, compile_files


def compile_text(text: str, name: str = "estate.yaml") -> CompileResult:
    return compile_files([SourceFile(name, text.encode())])


def codes(result: CompileResult) -> list[str]:
    return [d.code for d in result.diagnostics]


MINIMAL = """\
pools:
  - {name: onprem, kind: baremetal, capacity: 8, gpu_type: h100}
profiles:
  - {name: gpu1, gpus: 1, pools: [onprem], policies: [team-a]}
policies:
  - {name: team-a, group: team-a, reservation: 2, limit: 8}
groups:
  - {name: team-a, users: [alice]}
pricing:
  - {gpu_type: h100, per_gpu_hour: 2.5, effective_from: "2026-01-01T00:00:00Z"}
"""
