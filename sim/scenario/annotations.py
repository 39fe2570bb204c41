"""Reading type annotations: unwrap ``X | None`` and ``Annotated[...]``, list a union's members.

Why a module of its own: the scenario's error formatter (``sim.scenario.errors``) and its key
documentation (``sim.scenario.docs``) both walk the same pydantic field annotations, and neither
should depend on the other to do it.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin


def unwrap_optional(ann: Any) -> Any:
    """``X | None`` -> X, ``Annotated[X, ...]`` -> X."""
    while True:
        if get_origin(ann) is Annotated:
            ann = get_args(ann)[0]
            continue
        members = union_members(ann)
        real = [m for m in members if m is not type(None)]
        if members and len(real) == 1:
            ann = real[0]
            continue
        return ann


def union_members(ann: Any) -> tuple:
    """The members of ``A | B`` or ``Union[A, B]``; () for anything else."""
    if get_origin(ann) in (Union, types.UnionType):
        return get_args(ann)
    return ()
