"""Where ``model: ORG/NAME`` finds its ``config.json``, on this machine only (never the network).

Three places are searched, in this order, and the first hit wins:

1. the config files that ``aiconfigurator-core`` ships (``aiconfigurator_core/model_configs/
   ORG--NAME_config.json``), when that package is installed (``pip install 'cbsim[gpu-data]'``);
   found with ``importlib.util.find_spec``, so the package is not imported;
2. a local Hugging Face hub cache: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
   ``~/.cache/huggingface/hub``; a model there is ``models--ORG--NAME/snapshots/<rev>/config.json``
   (the newest snapshot when several are cached);
3. the copies cbsim ships of the configs its tests and docs use (``sim/hardware/configs/``:
   DeepSeek-V3/R1, Kimi-K2/K2.5, gpt-oss-20b/120b, nvidia/Llama-3.1-8B-Instruct-FP8 with its ModelOpt
   ``hf_quant_config.json``; each names its source in ``_cbsim_source``),
   so those names resolve without the optional package.

``cbsim models`` lists every name that resolves (:func:`available_models`).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from sim.errors import CbsimError

SHIPPED_DIR = Path(__file__).with_name("configs")


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str  # ORG/NAME
    path: Path  # its config.json
    origin: str  # "aiconfigurator-core", "hf-cache" or "cbsim"


def looks_like_hub_name(name: str) -> bool:
    """``ORG/NAME``: one slash, not a file path."""
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and not name.endswith(".json")


def aiconfigurator_configs_dir() -> Path | None:
    """``aiconfigurator_core/model_configs`` when the package is installed, else None."""
    try:
        spec = importlib.util.find_spec("aiconfigurator_core")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        folder = Path(base) / "model_configs"
        if folder.is_dir():
            return folder
    return None


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as ``huggingface_hub`` chooses it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def available_models() -> list[ModelSource]:
    """Every ``ORG/NAME`` with a local config.json, aiconfigurator-core's first, sorted by name."""
    found: dict[str, ModelSource] = {}
    for src in _folder_models(SHIPPED_DIR, "cbsim"):
        found[src.name] = src
    for src in _hf_cache_models():
        found[src.name] = src
    for src in _aiconfigurator_models():  # first place searched wins
        found[src.name] = src
    return sorted(found.values(), key=lambda s: s.name.lower())


def find_config(name: str) -> ModelSource:
    """The config.json of ``ORG/NAME``, or of the same architecture under another spelling or release
    (:func:`sim.hardware.model_names.same_architecture`: ``meta-llama/Llama-3.1-70B-Instruct`` is
    served by ``meta-llama/Meta-Llama-3.1-70B``); the returned ``name`` is the config's, so a caller
    can say which one served. Raises :class:`CbsimError` listing where it looked and suggesting
    configs of the same family."""
    from sim.hardware.model_names import family_suggestions, same_architecture

    folder = aiconfigurator_configs_dir()
    if folder is not None:
        path = folder / f"{name.replace('/', '--')}_config.json"
        if path.is_file():
            return ModelSource(name, path, "aiconfigurator-core")
    cached = _hf_snapshot_config(hf_cache_dir() / f"models--{name.replace('/', '--')}")
    if cached is not None:
        return ModelSource(name, cached, "hf-cache")
    shipped = SHIPPED_DIR / f"{name.replace('/', '--')}_config.json"
    if shipped.is_file():
        return ModelSource(name, shipped, "cbsim")
    sources = available_models()
    match = same_architecture(name, [s.name for s in sources])
    if match is not None:
        return next(s for s in sources if s.name == match)
    suggestions = family_suggestions(name, [s.name for s in sources])
    hint = f" (same family: {', '.join(repr(s) for s in suggestions)})" if suggestions else ""
    where = [f"{hf_cache_dir()} (Hugging Face cache)", f"{SHIPPED_DIR} (the copies cbsim ships)"]
    where.insert(0, str(folder) if folder else "aiconfigurator-core (not installed: pip install 'cbsim[gpu-data]')")
    raise CbsimError(f"model {name!r}: no config.json found locally{hint}; looked in "
                     f"{', '.join(where)}. cbsim never downloads: give model: {{hf_config: PATH}} with the "
                     f"config.json next to your weights, or run `cbsim models` to list what resolves")


def _aiconfigurator_models() -> list[ModelSource]:
    folder = aiconfigurator_configs_dir()
    return [] if folder is None else _folder_models(folder, "aiconfigurator-core")


def _folder_models(folder: Path, origin: str) -> list[ModelSource]:
    if not folder.is_dir():
        return []
    out = []
    for path in folder.glob("*_config.json"):
        stem = path.name.removesuffix("_config.json")
        if stem.endswith("_hf_quant") or "--" not in stem:
            continue  # ModelOpt quantization side files, not model configs
        out.append(ModelSource(stem.replace("--", "/", 1), path, origin))
    return out


def _hf_cache_models() -> list[ModelSource]:
    root = hf_cache_dir()
    if not root.is_dir():
        return []
    out = []
    for repo in root.glob("models--*--*"):
        cfg = _hf_snapshot_config(repo)
        if cfg is not None:
            out.append(ModelSource(repo.name.removeprefix("models--").replace("--", "/", 1), cfg, "hf-cache"))
    return out


def _hf_snapshot_config(repo: Path) -> Path | None:
    configs = [p for p in repo.glob("snapshots/*/config.json") if p.is_file()]
    return max(configs, key=lambda p: p.stat().st_mtime) if configs else None
