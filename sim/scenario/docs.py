"""Documentation of every scenario key (dotted path, type, default, description), for the README.

Why a module of its own: the key table is generated from the pydantic models' fields so the
README cannot drift from the code (``tests/test_readme.py`` checks it); walking the models for
documentation is a job apart from validating a scenario. ``Scenario.field_docs()`` and
``Scenario.field_docs_markdown()`` delegate here.
"""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from sim.scenario.annotations import union_members, unwrap_optional
from sim.scenario.schema import ModelSpecConfig, PolicyEntry


def field_docs(cls: type[BaseModel]) -> list[dict[str, str]]:
    """Every key (dotted, ``N`` for a list index) with its type, default and description."""
    return _field_docs(cls, "")


def field_docs_markdown(cls: type[BaseModel]) -> str:
    """:func:`field_docs` as a markdown table (the README's scenario-key reference)."""
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    for d in field_docs(cls):
        rows.append(f"| `{d['key']}` | {d['type']} | {d['default']} | {d['description']} |")
    return "\n".join(rows)


def _field_docs(cls: type[BaseModel], prefix: str) -> list[dict[str, str]]:
    rows = []
    for name, field in cls.model_fields.items():
        key = f"{prefix}{name}"
        ann = unwrap_optional(field.annotation)
        if field.default is not PydanticUndefined:
            default = field.default
        elif field.default_factory is ann:
            default = "(section)"
        elif field.default_factory is not None:
            default = field.default_factory()
        else:
            default = "required"
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json", exclude_none=True)
        default_text = default if default in ("required", "(section)") else yaml.safe_dump(
            default, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
        rows.append({"key": key, "type": _type_name(field.annotation), "default": default_text,
                     "description": field.description or ""})
        for sub, sub_prefix in _sub_models(ann, key):
            rows.extend(_field_docs(sub, sub_prefix))
    if issubclass(cls, PolicyEntry):
        rows.append({"key": f"{prefix}<knob>", "type": "per policy", "default": "the policy's own",
                     "description": "any knob of the named policy (`cbsim policies` lists them)"})
    return rows


def _sub_models(ann: Any, key: str) -> list[tuple[type[BaseModel], str]]:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [(ann, f"{key}.")]
    if get_origin(ann) is list:
        inner = unwrap_optional(get_args(ann)[0])
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return [(inner, f"{key}.N.")]
    return [(m, f"{key}.") for m in union_members(ann) if isinstance(m, type) and issubclass(m, BaseModel)]


def _type_name(ann: Any) -> str:
    if get_origin(ann) is Literal:
        return " \\| ".join(str(a) for a in get_args(ann))
    members = union_members(ann)
    if members:
        return " \\| ".join(_type_name(m) for m in members)
    if get_origin(ann) is list:
        return f"list of {_type_name(get_args(ann)[0])}"
    if ann is type(None):
        return "null"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "mapping" if ann is not ModelSpecConfig else "inline model"
    return getattr(ann, "__name__", str(ann))
