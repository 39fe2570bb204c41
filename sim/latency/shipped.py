"""Latency tables shipped with cbsim, addressed by name: ``latency: {backend: table, name: NAME}``.

Why: a scenario that named a shipped table by a path relative to itself
(``../calib/tables/kernel-db-llama-3-8b-h200-tp1``) stopped running once copied elsewhere. A name
is resolved from the installed package instead: the folders of ``calib/tables/`` (package data,
``pyproject.toml``), found with ``importlib.util.find_spec("calib")``, which locates the package
without importing it, so neither torch nor anything of ``calib`` is loaded (``sim/`` never imports
``calib``: ARCHITECTURE.md). ``cbsim tables`` lists them (:func:`shipped_tables`).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import CbsimError, nearest


@dataclass(frozen=True, slots=True)
class ShippedTable:
    """One shipped table and what its metadata.json says about it."""

    name: str
    path: Path
    metadata: dict[str, Any]

    def facts(self) -> dict[str, Any]:
        """GPU, model, TP, dtype, source, engine and version, and the measured error, for ``cbsim tables``."""
        m, prov = self.metadata, self.metadata.get("provenance") or {}
        # composed tables call it aic_agreement (agreement with AIConfigurator's own predictor); older
        # and measured tables heldout_error: the same mapping
        held = m.get("aic_agreement") or m.get("heldout_error") or {}
        corpus = m.get("corpus_error") or {}
        model = m.get("model") or {}
        return {
            "name": self.name,
            "gpu": m.get("device"),
            "model": model.get("name") if isinstance(model, dict) else model,
            "tensor_parallel": m.get("tensor_parallel"),
            "dtype": m.get("dtype"),
            "block_size": m.get("block_size"),
            "source": m.get("source"),
            "engine": prov.get("engine"),
            "engine_version": prov.get("engine_version"),
            "package": " ".join(str(x) for x in (prov.get("package"), prov.get("package_version")) if x) or None,
            "heldout_mean_abs_rel": held.get("mean_abs_rel"),
            "heldout_p90_abs_rel": held.get("p90_abs_rel"),
            "heldout_n": held.get("n"),
            "heldout_measured_on": held.get("measured_on"),
            "corpus_rows": corpus.get("rows"),
            "corpus_ttft_median_abs": (corpus.get("ttft") or {}).get("median_abs"),
            "corpus_tpot_median_abs": (corpus.get("tpot") or {}).get("median_abs"),
            "known_limits": prov.get("known_limits"),
            "path": str(self.path),
        }


def shipped_tables_dir() -> Path | None:
    """``calib/tables`` of the installed package (or of this checkout), None when absent."""
    try:
        spec = importlib.util.find_spec("calib")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(base) / "tables"
        if folder.is_dir():
            return folder
    return None


def shipped_tables() -> list[ShippedTable]:
    """Every shipped table (a folder with ``metadata.json`` and ``table.csv``), sorted by name."""
    folder = shipped_tables_dir()
    if folder is None:
        return []
    out = []
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        meta = d / "metadata.json"
        if meta.is_file() and (d / "table.csv").is_file():
            try:
                data = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            out.append(ShippedTable(d.name, d, data if isinstance(data, dict) else {}))
    return out


def shipped_table_names() -> list[str]:
    folder = shipped_tables_dir()
    if folder is None:
        return []
    return sorted(p.name for p in folder.iterdir() if (p / "metadata.json").is_file())


def shipped_table_path(name: str, field: str = "latency.name") -> Path:
    """The folder of the shipped table ``name``; a :class:`CbsimError` naming ``field`` otherwise."""
    names = shipped_table_names()
    if name in names:
        return shipped_tables_dir() / name
    if not names:
        raise CbsimError(f"{field}: no shipped latency tables found (calib/tables/ of the installed cbsim is "
                         f"missing); give latency.path DIR instead")
    raise CbsimError(f"{field}: {name!r} is not a shipped latency table{nearest(name, names)}; shipped: "
                     f"{', '.join(names)} (`cbsim tables` lists them), or give latency.path DIR for your own")
