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
        from sim.outputs import check_folder

        out = check_folder(out_dir)  # a file, an unwritable folder, a name too long
        if not out.exists():
            return out
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
        made = [p for p in (out.parent, *out.parent.parents) if not p.exists()]  # deepest first
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        except BaseException:
            _remove_empty(made)
            raise
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
            _remove_empty(made)  # a failed save leaves no empty results/ behind
            raise
        if old is not None:
            try:
                shutil.rmtree(old)
            finally:  # even when interrupted half-way: no hidden leftovers
                shutil.rmtree(old, ignore_errors=True)
        return out

    @classmethod
    def load(cls, out_dir: str | Path) -> RunResult:
        """Read a results folder back. A missing, truncated or corrupt file is one
        :class:`CbsimError` naming it and how to write it again, never a pyarrow or json crash."""
        from sim.errors import CbsimError, ScenarioError
        from sim.scenario.schema import load_scenario

        d = Path(out_dir)
        if not d.is_dir():
            raise CbsimError(f"{d} is not a folder: give the results folder of a run "
                             "(`cbsim run SCENARIO --out DIR` writes one)")
        missing = [f for f in RESULT_FILES if not (d / f).exists()]
        if missing:
            raise CbsimError(f"{d} is not a cbsim results folder: missing {', '.join(missing)} "
                             "(make one with `cbsim run SCENARIO --out DIR`)")
        rerun = (f"a re-run writes it again: cbsim run {d / 'scenario.yaml'} --out {d} (the resolved scenario "
                 f"the folder was written from)")
        try:
            scenario = load_scenario(d / "scenario.yaml")
        except ScenarioError as exc:
            raise CbsimError(f"{exc}; a re-run writes it again: cbsim run SCENARIO --out {d}, with the "
                             f"scenario it was run from") from None
        summary = _read_summary(d / "summary.json", rerun)
        return cls(
            scenario=scenario,
            requests=_read_frame(d / "requests.parquet", _request_columns(), rerun),
            steps=_read_frame(d / "steps.parquet", _step_columns(), rerun),
            summaries=summary["policies"],
            meta=summary.get("meta") or {},
        )


def _read_summary(path: Path, rerun: str) -> dict:
    """summary.json: ``{"policies": {label: {...}}, "meta": {label: {...}}}``, shape checked."""
    from sim.errors import CbsimError
    from sim.user_files import Fields, read_json

    try:
        data = read_json(path, "results summary")
    except CbsimError as exc:
        raise CbsimError(f"{path} is unreadable: {str(exc).removeprefix(f'{path}: ')}; {rerun}") from None
    f = Fields(path)
    try:
        policies = f.items(f.get(data, "policies", "", dict), "policies", dict)
        if not policies:
            raise f.fail("policies", "is empty: no policy's summary")
        for label, s in policies:
            for key in ("utilization",):
                f.get(s, key, f"policies.{label}", dict, {})
            f.get(s, "kv_waste", f"policies.{label}", float, None)
        for label, m in f.items(f.get(data, "meta", "", dict, {}), "meta", dict):
            f.get(m, "max_slots", f"meta.{label}", float, None)
            f.get(m, "policy", f"meta.{label}", str, None)
    except CbsimError as exc:
        raise CbsimError(f"{exc}; {rerun}") from None
    return data


def _read_frame(path: Path, columns: dict[str, bool], rerun: str) -> pd.DataFrame:
    """A parquet file of the folder, with the columns the plots read (name -> numeric?)."""
    import pyarrow

    from sim.errors import CbsimError

    try:
        frame = pd.read_parquet(path)
    except (pyarrow.ArrowException, OSError, ValueError) as exc:  # a truncated or foreign file
        reason = str(exc).split(". ")[0].split(": ")[-1][:120] or type(exc).__name__
        raise CbsimError(f"{path} is unreadable ({reason}); {rerun}") from None
    for c in LATER_REQUEST_COLUMNS:  # a results folder written before these columns existed: none of them
        if c in columns and c not in frame.columns:
            frame[c] = -1
    if "refused" in columns and "refused" not in frame.columns and {"state", "reason"} <= set(frame.columns):
        # written before refusals were told apart: TGI's 429 was (and is) the only refusal for the load
        frame["refused"] = (frame["state"] == "rejected") & frame["reason"].astype(str).str.startswith("429")
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise CbsimError(f"{path} lacks the column(s) {', '.join(absent[:5])}; it was not written by this "
                         f"cbsim; {rerun}")
    wrong = [c for c, numeric in columns.items() if numeric and not pd.api.types.is_numeric_dtype(frame[c])]
    if wrong:
        raise CbsimError(f"{path}: column(s) {', '.join(wrong[:5])} are not numbers; {rerun}")
    return frame


LATER_REQUEST_COLUMNS = ("client", "session", "turn")  # -1: an open-loop request outside sessions


def _request_columns() -> dict[str, bool]:
    from sim.metrics.recorder import REQUEST_COLUMNS

    text = ("id", "state", "reason", "policy")
    return {c: c not in text for c in ("policy", *REQUEST_COLUMNS) if c != "token_times_s"}


def _step_columns() -> dict[str, bool]:
    from sim.metrics.steps import ADDED_STEP_COLUMNS, STEP_COLUMNS

    return {"policy": False, **{c: True for c in STEP_COLUMNS if c not in ADDED_STEP_COLUMNS}}


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a failed save created (deepest first), where they are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty, or already gone
            return


RESULT_FILES = ("requests.parquet", "steps.parquet", "summary.json", "scenario.yaml")


def _is_result_file(name: str) -> bool:
    return name in RESULT_FILES or name.endswith(".png")
