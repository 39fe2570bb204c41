"""Scenario validation errors -> one readable line that names the key path and the fix.

Why a module of its own: pydantic reports a bad scenario as a multi-line dump with its own
location tuples (union branch tags, list indices). Turning that into ``engine.max_num_seqs:
must be >= 1, got 0 (from --set ...)`` is a job apart from defining the scenario's keys;
``sim.scenario.schema`` raises :class:`KeyedError` from its validators and calls
:func:`format_validation_error` when validation fails.
"""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from sim.errors import nearest
from sim.scenario.annotations import union_members, unwrap_optional


class KeyedError(ValueError):
    """A validation error about one key of the section being validated (``key`` may be dotted).

    ``unknown=True``: the key itself is not allowed; the message then continues
    "unknown key 'a.b.key'" (e.g. " for policy 'orca'; allowed keys: ...").
    """

    def __init__(self, key: str, message: str, unknown: bool = False) -> None:
        super().__init__(message)
        self.key = key
        self.unknown = unknown


_TYPE_WORDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "model_type": "a mapping (key: value)", "dict_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)", "list_type": "a list", "tuple_type": "a list",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def format_validation_error(exc: ValidationError, root: type[BaseModel], where: str | None = None,
                            overrides=()) -> str:
    """One line (or a few joined by '; ') that names each bad key path and the fix."""
    found: list[tuple[str, str | None]] = []  # (key path, message naming it), in pydantic's order
    type_errors: dict[str, list[tuple[str, Any]]] = {}
    for err in _likeliest_branches(exc.errors(include_url=False)):
        path, section = _walk(err["loc"], root)
        typ, ctx = err["type"], err.get("ctx") or {}
        cause = ctx.get("error")
        if typ == "value_error" and isinstance(cause, KeyedError):
            path = f"{path}.{cause.key}" if path else cause.key
            found.append((path, f"unknown key {path!r}{cause}" if cause.unknown else f"{path}: {cause}"))
        elif typ in _TYPE_WORDS:
            if path not in type_errors:
                found.append((path, None))  # placeholder: the branches of a union are merged below
            type_errors.setdefault(path, []).append((_TYPE_WORDS[typ], err.get("input")))
        else:
            msg = _describe(err, path, section)
            found.append((path, msg if typ == "extra_forbidden" or not path else f"{path}: {msg}"))
    for i, (path, text) in enumerate(found):
        if text is not None:
            continue
        if any((p == path or p.startswith(path + ".")) and t is not None for p, t in found):
            continue  # another branch of a union reports the real problem (an inline model's key)
        kinds = type_errors[path]
        words = " or ".join(dict.fromkeys(w for w, _ in kinds))
        found[i] = (path, f"{path}: expected {words}, got {show_value(kinds[0][1])}")
    found = [(p, t) for p, t in found if t is not None]
    messages = list(dict.fromkeys(text + _from_override(path, overrides) for path, text in found))
    if len(messages) > 5:
        messages = messages[:5] + [f"and {len(messages) - 5} more"]
    prefix = f"{where}: " if where else ""
    return prefix + "; ".join(messages)


def _likeliest_branches(errors: list[dict]) -> list[dict]:
    """Where a value matches none of a union's mapping branches (``model: str | ModelSpecConfig |
    HfModelConfig``), pydantic reports every branch's errors; keep only those of the branch the
    user most likely meant, the one with the fewest errors (an inline spec with one bad value,
    not "hf_config: required; num_layers: unknown key; ..." from the branch it was never meant as)."""
    groups: dict[tuple, dict[str, int]] = {}
    tags: list[tuple | None] = []
    for err in errors:
        loc = err["loc"]
        i = next((i for i, el in enumerate(loc) if _is_model_tag(el)), None)
        tags.append(None if i is None else (loc[:i], loc[i]))
        if i is not None:
            branch = groups.setdefault(loc[:i], {})
            branch[loc[i]] = branch.get(loc[i], 0) + 1
    best = {prefix: min(counts, key=counts.get) for prefix, counts in groups.items() if len(counts) > 1}
    return [err for err, tag in zip(errors, tags) if tag is None or best.get(tag[0], tag[1]) == tag[1]]


def _is_model_tag(el: Any) -> bool:
    """pydantic's name of a union branch that is a model: 'HfModelConfig', or
    'function-after[_check(), ModelSpecConfig]' for one with validators (field names are lower case)."""
    return isinstance(el, str) and (el[:1].isupper() or el.startswith(("function-", "model-")))


def _from_override(path: str, overrides) -> str:
    for item in overrides:
        key = item.partition("=")[0].strip()
        if path == key or path.startswith(key + ".") or key.startswith(path + ".") and path:
            return f" (from --set {item})"
    return ""


def _describe(err: dict, path: str, section: type | None) -> str:
    typ, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if typ == "extra_forbidden":
        key = path.rsplit(".", 1)[-1]
        allowed = list(section.model_fields) if section is not None else []
        return (f"unknown key {path!r}{nearest(key, allowed)}; allowed keys: {', '.join(allowed)}"
                if allowed else f"unknown key {path!r}")
    if typ == "missing":
        return "required key is missing"
    if typ == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"expected one of {', '.join(choices)}, got {show_value(value)}{nearest(str(value), choices)}"
    if typ in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return f"must be {_BOUNDS[typ]} {bound}, got {show_value(value)}"
    if typ in ("too_short", "too_long"):
        return f"{err['msg'].lower()}"
    if typ == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"{err['msg']} (got {show_value(value)})"


SHOWN_LIST_CHARS = 40  # a list longer than this in the message is shown as "a list"


def show_value(value: Any) -> str:
    """A value as the message shows it: YAML words (null, true) and short lists; mappings by kind.

    The text is built with a budget and abandoned as soon as it passes it, so a value of any size
    (a million-entry list, or YAML aliases nested into billions of entries) costs microseconds:
    rendering it whole first and cutting it after hung for minutes and took gigabytes."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        text = _bounded_repr(value, SHOWN_LIST_CHARS)
        return text if text is not None else "a list"
    if isinstance(value, str) and len(value) > 200:
        return repr(value[:200]) + "..."
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _walk(loc: tuple, root: type[BaseModel]) -> tuple[str, type | None]:
    """Turn pydantic's error location into our dotted key path (union branch tags such as
    'ModelSpecConfig' dropped). Returns (path, the model class that holds the last key)."""
    parts: list[str] = []
    ann: Any = root
    holder: type | None = None
    for el in loc:
        ann = unwrap_optional(ann)
        if isinstance(el, int):
            parts.append(str(el))
            args = get_args(ann)
            ann = args[0] if get_origin(ann) is list and args else None
            continue
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            holder = ann
            field = ann.model_fields.get(el)
            parts.append(str(el))
            ann = field.annotation if field is not None else None
            continue
        members = union_members(ann)
        match = next((m for m in members if _is_tag_of(str(el), m)), None)
        if match is not None:
            ann = match
            continue
        parts.append(str(el))
        ann = None
    return ".".join(parts), holder


def _is_tag_of(tag: str, member: Any) -> bool:
    """pydantic names a union branch by its type: 'str', 'ModelSpecConfig', or for a model with
    validators 'function-after[_check(), ModelSpecConfig]'."""
    name = getattr(member, "__name__", None)
    return bool(name) and (tag == name or re.search(rf"\b{re.escape(name)}\]?$", tag) is not None)


def _bounded_repr(value: Any, budget: int) -> str | None:
    """``repr(value)`` if it is at most ``budget`` characters, else None, without building more
    than about ``budget`` characters of it (lists are walked one element at a time)."""
    if not isinstance(value, list | tuple):
        if isinstance(value, dict):
            return None if value else "{}"
        if isinstance(value, str) and len(value) > budget:
            return None
        text = repr(value)
        return text if len(text) <= budget else None
    parts: list[str] = []
    used = 2
    for item in value:
        if used > budget:
            return None
        text = _bounded_repr(item, budget - used)
        if text is None:
            return None
        parts.append(text)
        used += len(text) + 2
    text = "[" + ", ".join(parts) + "]"
    return text if len(text) <= budget else None
