"""A search builds a latency model per replica per probe: the table folder is read once as its
files stand (sim.latency.table.read_table_once), and read again once it is rewritten."""

from __future__ import annotations

import shutil

import sim.latency.table as table_mod
from sim.latency.shipped import shipped_table_path
from sim.latency.table_format import read_table, write_table


def test_one_read_per_table_folder_until_it_is_rewritten(tmp_path, monkeypatch):
    folder = tmp_path / "t"
    shutil.copytree(shipped_table_path("kernel-db-llama-3-8b-h200-tp1"), folder)
    reads = []
    real = table_mod.read_table

    def counting(path):
        reads.append(path)
        return real(path)

    monkeypatch.setattr(table_mod, "read_table", counting)
    first = table_mod.read_table_once(folder)
    assert (
        table_mod.read_table_once(folder) is first and table_mod.read_table_once(str(folder) + "/") is first
    )
    assert len(reads) == 1
    # rewritten (a fresh calibration): read again, and the new content is what comes back
    changed = read_table(folder)
    changed.metadata["date"] = "rewritten"
    write_table(folder, changed)
    again = table_mod.read_table_once(folder)
    assert len(reads) == 2 and again is not first and again.metadata["date"] == "rewritten"
