"""CosyVoice's HyperPyYAML model config, read as data (issue 22).

The published ``cosyvoice2.yaml`` / ``cosyvoice3.yaml`` describe the model with HyperPyYAML
tags (``!new:cosyvoice.llm.llm.Qwen2LM``, ``!name:...``, ``!ref <key>``, ``!apply:...``). Here
nothing in the file is imported or executed: a safe YAML loader turns every tag into a `Tag`
(its kind, its dotted target and its arguments), ``!ref`` expressions are resolved against the
file's own top-level keys (with plain arithmetic only), and the engine maps the targets it knows
to its own classes (`build_spec`); any other target in what it builds is one `ConfigError` that
names the tag and where it sits. ``!apply:`` entries (upstream seeds its RNGs with them) are
data and never run.
"""
from __future__ import annotations

import ast
import dataclasses
import operator
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import CheckpointError


class ConfigError(CheckpointError):
    """A model yaml that cannot be read, or a tag the engine does not implement."""


@dataclasses.dataclass
class Tag:
    """One tagged node: ``kind`` is ``new``, ``name``, ``apply`` or ``ref``; ``target`` the dotted
    name (for ``ref`` the expression); ``args`` the mapping or list under it."""

    kind: str
    target: str
    args: Any = None


def _loader() -> type:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct(loader: Any, suffix: str, node: Any) -> Tag:
        full = node.tag  # "!new:pkg.Cls", "!ref", "!name:pkg.fn"
        kind, _, target = full[1:].partition(":")
        if isinstance(node, yaml.MappingNode):
            args: Any = loader.construct_mapping(node, deep=True)
        elif isinstance(node, yaml.SequenceNode):
            args = loader.construct_sequence(node, deep=True)
        else:
            args = loader.construct_scalar(node)
        if kind == "ref":
            return Tag("ref", str(args))
        return Tag(kind, target, args if args != "" else None)

    Loader.add_multi_constructor("!", construct)
    return Loader


_REF = re.compile(r"<([^<>]+)>")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.USub: operator.neg}


def _arith(expr: str) -> Any:
    """A number from ``2 * 25`` etc.: literals and + - * / // only."""
    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(expr)
    return ev(ast.parse(expr, mode="eval"))


class ModelConfig:
    """The top-level mapping of a CosyVoice yaml with ``!ref`` resolved on access."""

    def __init__(self, data: Mapping[str, Any], path: Path, overrides: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.data = {**data, **(overrides or {})}

    @classmethod
    def read(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> ModelConfig:
        import yaml

        path = Path(path)
        try:
            data = yaml.load(path.read_text(encoding="utf-8"), Loader=_loader())  # noqa: S506 - a SafeLoader subclass
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot be read as YAML ({exc})") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a YAML mapping")
        return cls(data, path, overrides)

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str) -> Any:
        """Entry `key`, every ``!ref`` inside it resolved."""
        if key not in self.data:
            raise ConfigError(f"{self.path.name}: no entry {key!r}")
        return self.resolve(self.data[key], key)

    def resolve(self, value: Any, where: str, depth: int = 0) -> Any:
        if depth > 32:
            raise ConfigError(f"{self.path.name}: {where}: !ref nests too deep (a cycle?)")
        if isinstance(value, Tag):
            if value.kind == "ref":
                return self._ref(value.target, where, depth)
            return Tag(value.kind, value.target, self.resolve(value.args, where, depth + 1))
        if isinstance(value, dict):
            return {k: self.resolve(v, f"{where}/{k}", depth + 1) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        return value

    def _ref(self, expr: str, where: str, depth: int) -> Any:
        names = _REF.findall(expr)
        if not names:
            raise ConfigError(f"{self.path.name}: {where}: !ref {expr!r} names no <key>")
        values = {}
        for name in names:
            if name not in self.data:
                raise ConfigError(f"{self.path.name}: {where}: !ref <{name}>: no such entry")
            values[name] = self.resolve(self.data[name], name, depth + 1)
        if _REF.fullmatch(expr.strip()):
            return values[names[0]]
        text = _REF.sub(lambda m: repr(values[m.group(1)]), expr)
        try:
            return _arith(text)
        except (ValueError, SyntaxError, TypeError, ZeroDivisionError) as exc:
            raise ConfigError(f"{self.path.name}: {where}: !ref {expr!r} is not plain arithmetic") from exc


def expect(tag: Any, kinds: Mapping[str, Any], where: str, path: Path) -> Any:
    """The entry of `kinds` that `tag`'s target names: the engine's own class for it. Anything
    else is one clear error naming the tag."""
    if not isinstance(tag, Tag) or tag.kind not in ("new", "name"):
        raise ConfigError(f"{path.name}: {where}: expected a !new: or !name: tag, got {tag!r}")
    if tag.target not in kinds:
        known = ", ".join(sorted(kinds))
        raise ConfigError(f"{path.name}: {where}: unknown tag !{tag.kind}:{tag.target} "
                          f"(this engine implements: {known})")
    return kinds[tag.target]


def args_of(tag: Tag) -> dict[str, Any]:
    """A tag's keyword arguments (an empty dict when it has none)."""
    if tag.args is None:
        return {}
    if not isinstance(tag.args, dict):
        raise ConfigError(f"!{tag.kind}:{tag.target}: expected keyword arguments, got {tag.args!r}")
    return dict(tag.args)
