"""A large workload of requests with content of their own, kept as columns: each
:class:`RequestSpec` is made when it is asked for.

Why: a list of a million ``RequestSpec`` objects (the object, its id string and its arrival float:
about 240 bytes a request) is the largest thing a long synthetic run holds besides its step
records, and Python's allocator keeps the pages of objects freed out of order, so letting them go
during the run does not give the memory back. Here a request costs its four numbers (32 bytes);
the spec of a request exists while the engine holds the request. Only workloads whose requests
all leave their content to ``Request``'s defaults (no shared prefix, no trace hash ids, no
sessions) and are large (:data:`COLUMNS_FROM` requests) are kept this way
(:func:`sim.workload.synthetic.build_workload`); the specs it makes are equal, field for field,
to the ones the list would hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields

import numpy as np

from sim.workload.request_spec import RequestSpec

COLUMNS_FROM = 50_000  # requests: from this size a synthetic workload of own content is kept as columns
_CHUNK = 4096


# what a spec of the columns leaves at RequestSpec's defaults
_DEFAULTS = {"priority": 0, "prompt_runs": None, "output_key": None, "client": -1, "session": -1, "turn": -1,
             "think_s": 0.0}
_GIVEN = ("id", "arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "cut")


def spec_maker() -> Callable[..., RequestSpec]:
    """``make(id, arrival_s, prompt, output, max_tokens, cut)``: the ``RequestSpec`` of those and
    the defaults above, the same spec field for field, made by its slots' own setters (0.6 us
    against 1.5 us for the frozen dataclass's ``__init__``, which sets each of its 13 fields
    through ``object.__setattr__``: about 1 % of a million-request run). Where RequestSpec's
    fields or defaults are not the ones written here, the plain constructor."""
    fs = fields(RequestSpec)
    if {f.name: f.default for f in fs if f.name not in _GIVEN} != _DEFAULTS or len(fs) != len(_DEFAULTS) + 6:
        return lambda i, a, p, o, m, cut: RequestSpec(i, a, p, o, m, cut=cut)
    new = object.__new__
    s_id, s_arr, s_p, s_o, s_m, s_cut = (getattr(RequestSpec, n).__set__ for n in _GIVEN)
    s_pri, s_runs, s_key, s_client, s_session, s_turn, s_think = (
        getattr(RequestSpec, n).__set__ for n in _DEFAULTS)

    def make(i: str, a: float, p: int, o: int, m: int, cut: str) -> RequestSpec:
        spec = new(RequestSpec)
        s_id(spec, i)
        s_arr(spec, a)
        s_p(spec, p)
        s_o(spec, o)
        s_m(spec, m)
        s_pri(spec, 0)
        s_runs(spec, None)
        s_key(spec, None)
        s_client(spec, -1)
        s_session(spec, -1)
        s_turn(spec, -1)
        s_think(spec, 0.0)
        s_cut(spec, cut)
        return spec

    return make


class SpecColumns(Sequence):
    """``n`` requests named ``r`` + the zero-padded index, in arrival order."""

    # every request's content is its own and every id distinct: sim.workload.sharing's answer is
    # position 0 for each, without building the keys
    all_own = True

    def __init__(
        self,
        arrival_s: np.ndarray,
        prompt: np.ndarray,
        output: np.ndarray,
        max_tokens: np.ndarray,
        cut: np.ndarray,
        cut_reason: str,
    ) -> None:
        self.arrival_s = np.ascontiguousarray(arrival_s, dtype=np.float64)
        self.prompt = np.ascontiguousarray(prompt, dtype=np.int64)
        self.output = np.ascontiguousarray(output, dtype=np.int64)
        self.max_tokens = np.ascontiguousarray(max_tokens, dtype=np.int64)
        self.cut = np.ascontiguousarray(cut, dtype=bool)
        self.cut_reason = cut_reason
        self.width = max(6, len(str(max(len(self.arrival_s) - 1, 0))))

    def __len__(self) -> int:
        return len(self.arrival_s)

    def _spec(self, i: int) -> RequestSpec:
        return RequestSpec(
            f"r{i:0{self.width}d}",
            float(self.arrival_s[i]),
            int(self.prompt[i]),
            int(self.output[i]),
            int(self.max_tokens[i]),
            0,
            None,
            cut=self.cut_reason if self.cut[i] else "",
        )

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._spec(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("request index out of range")
        return self._spec(i)

    def __iter__(self) -> Iterator[RequestSpec]:
        w, reason = self.width, self.cut_reason
        make = spec_maker()
        name = f"r{{:0{w}d}}".format  # f"r{i:0{w}d}" (ids()), the format parsed once
        for lo in range(0, len(self), _CHUNK):  # a chunk's numbers as Python objects at a time
            hi = lo + _CHUNK
            arr, p, o, m = (
                a[lo:hi].tolist() for a in (self.arrival_s, self.prompt, self.output, self.max_tokens)
            )
            cut = self.cut[lo:hi].tolist()
            for j in range(len(arr)):
                yield make(name(lo + j), arr[j], p[j], o[j], m[j], reason if cut[j] else "")

    def __eq__(self, other) -> bool:
        if isinstance(other, SpecColumns | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None

    def ids(self) -> list[str]:
        w = self.width
        return [f"r{i:0{w}d}" for i in range(len(self))]

    def clear(self) -> None:
        """The caller is done with the workload (``sim.runner.run_policy``'s ``release``)."""
        empty_f, empty_i = np.zeros(0), np.zeros(0, dtype=np.int64)
        self.arrival_s, self.prompt, self.output, self.max_tokens = empty_f, empty_i, empty_i, empty_i
        self.cut = np.zeros(0, dtype=bool)
