"""``--set a.b.c=value``: change any field of a scenario from the command line.

The path is the scenario's own key names joined by dots; list entries are addressed by index
(``policies.0.batch_size=16``), and the index one past the end appends a new entry
(``policies.2.name=sarathi``). The value is parsed as YAML, so ``12`` is a number, ``true`` a
boolean, ``[0, 600]`` a list and ``{name: orca}`` a mapping; ``1e3`` is a number too (plain
YAML 1.1 would read it as text). Overrides apply to the raw mapping *before* validation, so an
overridden key is checked exactly like one written in the file.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from sim.errors import ScenarioError

_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$|^[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?$")


MAX_ALIAS_EXPANSION = 100_000  # values that aliases (*name) may add to a document, expanded


class YamlTooLarge(yaml.YAMLError):
    """A document whose aliases expand beyond :data:`MAX_ALIAS_EXPANSION` values, or refer to
    themselves: refused before anything walks the expanded value."""

    def __init__(self, problem: str, mark) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a duplicate key is an error (PyYAML silently keeps
    the last one), ``1e3`` or ``.5`` are numbers (YAML 1.1 needs ``1.0e+3``), and aliases may
    not expand a document by more than :data:`MAX_ALIAS_EXPANSION` values.

    Why the bound: PyYAML builds an alias as a reference to the anchored value, so a 1 KB file
    of nested aliases (the "billion laughs") loads at once, but anything that walks the value
    (validation, an error message, ``deepcopy`` into a list field) meets billions of entries."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases = getattr(self, "_aliases", 0) + 1
        return super().compose_node(parent, index)

    def compose_document(self):
        node = super().compose_document()
        if getattr(self, "_aliases", 0):
            _check_expansion(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            "while reading a mapping", node.start_mark,
                            f"found duplicate key {key!r} (first at line {seen[key].line + 1})",
                            key_node.start_mark)
                    seen[key] = key_node.start_mark
                except TypeError:
                    pass  # an unhashable key: let PyYAML report it
        return super().construct_mapping(node, deep)


def _check_expansion(root) -> None:
    """Raise :class:`YamlTooLarge` if the node graph, with every alias expanded, holds more than
    :data:`MAX_ALIAS_EXPANSION` values beyond the distinct ones written (sizes are memoized per
    node, so this costs one pass over the distinct nodes), or if an alias refers to itself."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            continue
        if key in size:
            continue
        if key in on_path:
            raise YamlTooLarge("an alias (*name) refers to the value that holds it: a scenario value cannot "
                               "contain itself", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise YamlTooLarge("an alias (*name) refers to the value that holds it: a scenario value "
                                   "cannot contain itself", child.start_mark)
            if id(child) not in size:
                stack.append((child, False))
    if size[id(root)] - len(size) > MAX_ALIAS_EXPANSION:
        field, node = _heaviest_field(root, size)
        where = f"{field}: " if field else ""
        raise YamlTooLarge(f"{where}its aliases (*name) expand to more than {MAX_ALIAS_EXPANSION:,} values (a "
                           f"scenario needs far fewer: nested aliases multiply); write the values out, or nest "
                           f"fewer aliases", node.start_mark)


def _heaviest_field(root, size: dict[int, int]) -> tuple[str, Any]:
    """The dotted key (``slo.ttft_s``) whose value holds the expansion, and its node: from the root,
    down the mapping value that expands most for as long as that value alone passes the bound."""
    keys: list[str] = []
    node = root
    while isinstance(node, yaml.MappingNode) and node.value:
        key_node, value = max(node.value, key=lambda kv: size.get(id(kv[1]), 0))
        if size.get(id(value), 0) <= MAX_ALIAS_EXPANSION or not isinstance(key_node, yaml.ScalarNode):
            break
        keys.append(str(key_node.value))
        node = value
    return ".".join(keys), node


# Copy the resolver table before extending it: PyYAML shares the per-character lists with
# SafeLoader, and appending to them would change every other YAML reader in the process.
StrictLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def parse_value(text: str, key: str | None = None) -> Any:
    """A --set value as YAML (empty text is null); ``key``, the field it sets, names it in errors."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except YamlTooLarge as exc:
        field = ".".join(x for x in (key, exc.problem.split(": its aliases")[0]
                                     if ": its aliases" in exc.problem else None) if x)
        problem = exc.problem.split(": ", 1)[1] if ": its aliases" in exc.problem else exc.problem
        raise ScenarioError(f"--set {field or 'value'}: {problem}") from None
    except yaml.YAMLError as exc:
        problem = str(getattr(exc, "problem", None) or exc).splitlines()[0]  # one line, no "in <unicode string>"
        raise ScenarioError(f"--set value {text!r} is not valid YAML: {problem}") from None
    except RecursionError:
        raise ScenarioError(f"--set value {text[:40]!r}...: nested too deeply to read") from None
    except ValueError as exc:  # a 5000-digit integer
        raise ScenarioError(f"--set value {text[:40]!r}: unreadable: {str(exc).split(';')[0]}") from None


def split_override(item: str) -> tuple[list[str], Any]:
    """``"a.b.0.c=value"`` -> (["a", "b", "0", "c"], parsed value)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"--set {item!r}: expected KEY=VALUE, e.g. workload.arrival.rate=12 "
                            f"or policies.0.batch_size=16")
    parts = key.split(".")
    if any(not p for p in parts):
        raise ScenarioError(f"--set {item!r}: the key {key!r} has an empty part; write names joined by "
                            f"single dots, e.g. engine.max_num_seqs")
    return parts, parse_value(text, key)


def apply_overrides(data: dict, overrides, defaults: dict | None = None) -> dict:
    """A copy of ``data`` with every ``KEY=VALUE`` of ``overrides`` applied, in order.

    Missing mappings along a path are created. A missing *list* (the path continues with an
    index) is taken from ``defaults`` (the scenario's defaults, e.g. the default ``policies``)
    when given. Errors name the override and the part of its path that does not fit.
    """
    out = copy.deepcopy(data) if data is not None else {}
    if not isinstance(out, dict):
        raise ScenarioError(f"cannot apply --set to {type(out).__name__}: a scenario is a mapping")
    for item in overrides or ():
        parts, value = split_override(item)
        node: Any = out
        default: Any = defaults
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            here = ".".join(parts[:i]) or "the scenario"
            default_next = _child(default, part)
            if isinstance(node, dict):
                if last:
                    node[part] = value
                elif node.get(part) is None:
                    nxt_is_index = parts[i + 1].isdigit()
                    if nxt_is_index and isinstance(default_next, list):
                        node[part] = copy.deepcopy(default_next)
                    elif nxt_is_index:
                        node[part] = []
                    else:
                        node[part] = {}
            elif isinstance(node, list):
                if not part.isdigit():
                    raise ScenarioError(f"--set {item}: {here} is a list; address an entry by its index "
                                        f"0..{len(node) - 1}, e.g. {here}.0.{part}")
                idx = int(part)
                if idx > len(node):
                    raise ScenarioError(f"--set {item}: {here} has {len(node)} entries (indices 0..{len(node) - 1}); "
                                        f"index {idx} is out of range (use {len(node)} to append one)")
                if idx == len(node):
                    node.append(value if last else {})
                elif last:
                    node[idx] = value
                part = idx  # type: ignore[assignment]
            else:
                raise ScenarioError(f"--set {item}: {here} is {_kind(node)}, not a section, so it has no "
                                    f"key {part!r}")
            if not last:
                node = node[part]
                default = default_next
    return out


def _child(default: Any, part: str) -> Any:
    if isinstance(default, dict):
        return default.get(part)
    if isinstance(default, list) and part.isdigit() and int(part) < len(default):
        return default[int(part)]
    return None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    return f"a {type(value).__name__}"
