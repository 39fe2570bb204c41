"""A run's results: DataFrames in memory, a folder on disk, and back.

The folder (DESIGN.md, "Files a user sees") holds ``requests.parquet`` and ``steps.parquet``
(each with a ``policy`` column holding the label), ``summary.json`` (``{"policies": {LABEL:
{...}}}``), the resolved ``scenario.yaml`` and the PNG plots. It is written into a temporary
sibling folder and renamed into place, so a crash or Ctrl-C never leaves half a result.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class RunResult:
    scenario: object  # sim.scenario.schema.Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame
    summaries: dict[str, dict]  # label -> summary
    meta: dict = field(default_factory=dict)  # label -> facts the plots need (slots, blocks, ...)

    @property
    def labels(self) -> list[str]:
        return list(self.summaries)

    @property
    def summary(self) -> pd.DataFrame:
        """One row per policy, nested figures flattened (``ttft_s.p99``, ``utilization.kv``)."""
        return pd.json_normalize([{"policy": k, **v} for k, v in self.summaries.items()]).set_index("policy")

    def summary_json(self) -> dict:
        return {"policies": self.summaries, "meta": self.meta}

    # --- plots (sim.plots draws them; these are the notebook-friendly entry points) -------------
    def __getattr__(self, name: str):
        if name.startswith("plot_"):
            from sim import plots

            fn = getattr(plots, name, None)
            if fn is not None:
                return lambda *a, **k: fn(self, *a, **k)
        raise AttributeError(name)

    def __dir__(self):
        """List the forwarded ``plot_*`` methods too, so tab completion and ``dir()`` find them."""
        from sim import plots

        return sorted(set(super().__dir__()) | {n for n in plots.__all__ if n.startswith("plot_")})

    # --- disk ---------------------------------------------------------------------------------
    @staticmethod
    def check_target(out_dir: str | Path) -> Path:
        """The folder :meth:`save` may write (resolved), or a :class:`CbsimError` if saving there
        would destroy something that is not an earlier cbsim result. Call it before a long run."""
        from sim.errors import CbsimError

        out = Path(out_dir).expanduser().resolve()
        if not out.exists():
            if out.parent.exists() and not out.parent.is_dir():
                raise CbsimError(f"cannot write results into {out}: {out.parent} is a file, not a folder")
            return out
        if not out.is_dir():
            raise CbsimError(f"cannot write results to {out}: it is a file; give a folder name (--out DIR)")
        entries = list(out.iterdir())
        foreign = [p.name for p in entries if not (p.is_file() and _is_result_file(p.name))]
        if entries and (foreign or not (out / "summary.json").exists()):
            shown = ", ".join(sorted(foreign)[:3]) or "no summary.json"
            raise CbsimError(f"{out} already exists and is not a cbsim results folder ({shown}); results "
                             f"replace a folder whole, so give a new folder or an earlier results folder (--out DIR)")
        return out

    def save(self, out_dir: str | Path, plots: bool = True) -> Path:
        """Write the results folder atomically: everything goes into a hidden temporary sibling,
        which is renamed into place only when complete. An existing results folder there is
        replaced whole (and put back if anything fails, Ctrl-C included); any other existing
        folder is refused (:meth:`check_target`)."""
        from sim.errors import CbsimError

        out = self.check_target(out_dir)
        try:
            return self._save(out, plots)
        except OSError as exc:  # no permission, disk full, a read-only file system
            raise CbsimError(f"cannot write results to {out}: {exc.strerror or exc}") from None

    def _save(self, out: Path, plots: bool) -> Path:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        old = None
        try:
            self.requests.to_parquet(tmp / "requests.parquet", index=False)
            self.steps.to_parquet(tmp / "steps.parquet", index=False)
            (tmp / "summary.json").write_text(json.dumps(self.summary_json(), indent=2, sort_keys=False) + "\n")
            (tmp / "scenario.yaml").write_text(self.scenario.to_yaml())
            if plots:
                from sim import plots as plots_mod

                write_all = getattr(plots_mod, "write_all", None)
                if write_all is not None:
                    write_all(self, tmp)
            if out.exists():
                old = out.parent / f".{out.name}.old-{os.getpid()}"
                out.rename(old)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and old.exists() and not out.exists():
                old.rename(out)  # put the earlier results back
            raise
        if old is not None:
            try:
                shutil.rmtree(old)
            finally:  # even when interrupted half-way: no hidden leftovers
                shutil.rmtree(old, ignore_errors=True)
        return out

    @classmethod
    def load(cls, out_dir: str | Path) -> RunResult:
        from sim.errors import CbsimError
        from sim.scenario.schema import load_scenario

        d = Path(out_dir)
        missing = [f for f in RESULT_FILES if not (d / f).exists()]
        if missing:
            raise CbsimError(f"{d} is not a cbsim results folder: missing {', '.join(missing)} "
                             "(make one with `cbsim run SCENARIO --out DIR`)")
        summary = json.loads((d / "summary.json").read_text())
        return cls(
            scenario=load_scenario(d / "scenario.yaml"),
            requests=pd.read_parquet(d / "requests.parquet"),
            steps=pd.read_parquet(d / "steps.parquet"),
            summaries=summary["policies"],
            meta=summary.get("meta", {}),
        )


RESULT_FILES = ("requests.parquet", "steps.parquet", "summary.json", "scenario.yaml")


def _is_result_file(name: str) -> bool:
    return name in RESULT_FILES or name.endswith(".png")
