"""An experiment file: the YAML that ``liftgate experiments create`` and ``liftgate up --config`` read.

One experiment, or ``{upstreams: [...], experiments: [...]}`` (see docs/concepts.md); checked
for shape here, for meaning by the gateway's admin API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def load_experiment_file(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(upstreams, experiments) from a YAML file: one experiment, or ``{upstreams: [...], experiments: [...]}``."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping (an experiment, or 'experiments:' and 'upstreams:')")
    if "experiments" in doc or "upstreams" in doc:
        upstreams, experiments = doc.get("upstreams") or [], doc.get("experiments") or []
    else:
        upstreams, experiments = [], [doc]
    if not isinstance(upstreams, list) or not isinstance(experiments, list):
        raise ValueError(f"{path}: 'upstreams' and 'experiments' must be lists")
    for i, exp in enumerate(experiments):
        where = f"{path}: experiment #{i + 1}"
        if not isinstance(exp, dict):
            raise ValueError(f"{where} must be a mapping")
        missing = [k for k in ("name", "route", "variants") if not exp.get(k)]
        if missing:
            raise ValueError(f"{where} ({exp.get('name', '?')}) is missing {', '.join(missing)}")
        if not isinstance(exp["variants"], list) or not all(isinstance(v, dict) for v in exp["variants"]):
            raise ValueError(f"{where}: 'variants' must be a list of mappings")
    for i, up in enumerate(upstreams):
        if not isinstance(up, dict) or not up.get("name") or not up.get("base_url"):
            raise ValueError(f"{path}: upstream #{i + 1} needs 'name' and 'base_url'")
    return upstreams, experiments
