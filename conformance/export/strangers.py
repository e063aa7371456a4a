"""Engines kvsched drives through a stranger's adapter (docs/examples/), not a `kvsched targets`
target, that still get a standalone export: tokasaurus 0.0.4 (docs/examples/tokasaurus/).

Such an engine has no `conformance.targets.Target`: its venv is built by hand as its README says,
and CI never installs it. `ExportTarget` gives the exporter, the report and the both-ways campaign
the few things they read of a target (its release, its venv's Python, its environment), so a
stranger engine and a registry target are exported alike (`export_target`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from conformance.targets import TARGET_SPECS, Target


@dataclass(frozen=True)
class StrangerTarget:
    name: str
    version: str  # the release, as pip spells it
    venv: Path
    how_to_install: str  # where its venv recipe is
    env: dict[str, str] = field(default_factory=dict)
    venv_of: str = ""

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def installed(self) -> bool:
        return self.python.exists()


STRANGERS: dict[str, StrangerTarget] = {
    "tokasaurus": StrangerTarget("tokasaurus", "tokasaurus==0.0.4",
                                 Path.home() / ".cache" / "kvsched" / "stranger" / "tokasaurus",
                                 "docs/examples/tokasaurus/README.md, Install"),
}

ExportTarget = Target | StrangerTarget


def export_target(name: str) -> ExportTarget | None:
    """The registry target or the stranger engine called ``name``, if there is one."""
    return TARGET_SPECS.get(name) or STRANGERS.get(name)


def export_target_names() -> list[str]:
    return [*TARGET_SPECS, *STRANGERS]


def venv_python_shown(target: ExportTarget) -> str:
    """The venv Python a report prints, with ``~`` for the home folder."""
    return "~/" + str(target.python.relative_to(Path.home())) if target.python.is_relative_to(Path.home()) \
        else str(target.python)
