"""Engine options as data: each engine takes one frozen, validated config dataclass.

An engine's `Config` lists its options in one place: name, type, default and a one-line meaning (the field's
`help`). Keyword arguments (`sdaccel.load(..., engine="fast", fp8=True)`) and command-line text (`--engine-opt
fast.fp8=1`) both go through `EngineConfig.from_options`, which refuses an unknown name or a value of the wrong type
with a one-line UsageError. Types come from the annotations: bool, int, float, str (with `choices`), tuple[str, ...]
and their `| None` forms.

    @dataclass(frozen=True)
    class EagerConfig(EngineConfig):
        channels_last: bool = option(True, "convolutional modules in NHWC memory (cuDNN's fast layout)")
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import MutableMapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Mapping

from ..errors import UsageError


class _Registry(MutableMapping):
    """name -> Engine class, importing the engine's module on first use (`sdaccel --help` and the fast engine's
    compile workers import none)."""

    def __init__(self, where: dict[str, str]):
        self._where = dict(where)  # name -> "module:Class", relative to sdaccel.engines
        self._loaded: dict[str, type] = {}

    def __getitem__(self, name: str) -> type:
        if name not in self._loaded:
            module, _, attribute = self._where[name].partition(":")  # KeyError for an unknown name
            self._loaded[name] = getattr(import_module(module, __package__), attribute)
        return self._loaded[name]

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __setitem__(self, name: str, cls: type) -> None:
        self._where[name] = f"{cls.__module__}:{cls.__qualname__}"
        self._loaded[name] = cls

    def __delitem__(self, name: str) -> None:
        del self._where[name]
        self._loaded.pop(name, None)


# The built-in engines, by the module each lives in: importing one costs its dependencies (torch.compile, Triton,
# onnxruntime), paid when it is first asked for.
ENGINES = _Registry({"eager": ".eager:EagerEngine", "compile": ".compile:CompileEngine", "fast": ".fast:FastEngine",
                     "onnxruntime": ".onnxruntime:OnnxRuntimeEngine"})


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def option(default: Any, help: str, *, choices: tuple | None = None, minimum: int | None = None,
           in_cache_key: bool = True) -> Any:
    """A config field: its default and one-line meaning; `choices` for a str (or each item of a tuple), `minimum`
    for an int; in_cache_key False for options that change neither results nor kernel picks (how many processes
    compile kernels, where weights wait), which an engine cache need not be keyed by."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                                        "in_cache_key": in_cache_key})


@dataclass(frozen=True)
class OptionInfo:
    """One option as `sdaccel engines NAME` and the reference docs list it."""

    name: str
    type: str  # "bool", "int", "str", "tuple[str]", with " | None" where None is allowed
    default: Any
    help: str
    choices: tuple | None


@dataclass(frozen=True)
class EngineConfig:
    """Base of every engine's options. Subclasses are frozen dataclasses whose fields are made with `option()`."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = _checked(f, _field_type(type(self), f.name), getattr(self, f.name))
            object.__setattr__(self, f.name, value)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None, base: EngineConfig | None = None,
                     what: str = "the engine", text: bool = False):
        """A config from `base` (default: the defaults) with `options` replaced. text: string values are parsed
        after the option's type (a bool takes 1/0, true/false, yes/no, on/off; a tuple comma-separated items; an
        optional one "none"), as the command line gives them. Unknown names or ill-typed values: UsageError."""
        if base is not None and not isinstance(base, cls):
            raise UsageError(f"expected a {cls.__name__}, got {type(base).__name__}")
        base = base if base is not None else cls()
        known = {f.name: f for f in dataclasses.fields(cls)}
        changes = {}
        for key, value in (options or {}).items():
            if key not in known:
                raise UsageError(f"{what} has no option {key!r}; its options: {', '.join(known) or 'none'}")
            if text and isinstance(value, str):
                value = parse_value(value, _field_type(cls, key), f"{what}, option {key}")
            changes[key] = value
        return dataclasses.replace(base, **changes)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Every option and its value (tuples as lists): what benchmark rows and PNG metadata record."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def cache_key(self) -> dict[str, Any]:
        """The options that change what the engine computes or picks: what an engine cache is keyed by."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.metadata.get("in_cache_key", True)}

    @classmethod
    def describe(cls) -> list[OptionInfo]:
        rows = []
        for f in dataclasses.fields(cls):
            kind, optional = _field_type(cls, f.name)
            name = {bool: "bool", int: "int", float: "float", str: "str", tuple: "tuple[str]"}[kind]
            rows.append(OptionInfo(f.name, name + (" | None" if optional else ""), f.default,
                                   f.metadata.get("help", ""), f.metadata.get("choices")))
        return rows


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


_TYPES: dict[tuple[type, str], tuple[type, bool]] = {}


def _field_type(cls: type, name: str) -> tuple[type, bool]:
    """(base type, whether None is allowed) of a config field, from its annotation."""
    key = (cls, name)
    if key not in _TYPES:
        hint = typing.get_type_hints(cls)[name]
        args = typing.get_args(hint)
        optional = (typing.get_origin(hint) in (typing.Union, types.UnionType)) and type(None) in args
        if optional:
            hint = next(a for a in args if a is not type(None))
        kind = tuple if typing.get_origin(hint) is tuple else hint
        if kind not in (bool, int, float, str, tuple):
            raise TypeError(f"{cls.__name__}.{name}: unsupported option type {hint}")
        _TYPES[key] = (kind, optional)
    return _TYPES[key]


def _checked(f: dataclasses.Field, field_type: tuple[type, bool], value: Any) -> Any:
    """`value` if it fits the field (a list becomes a tuple), else a one-line UsageError."""
    kind, optional = field_type
    name, choices, minimum = f.name, f.metadata.get("choices"), f.metadata.get("minimum")
    if value is None:
        if optional:
            return None
        raise UsageError(f"{name} may not be None")
    if kind is bool:
        if not isinstance(value, bool):
            raise UsageError(f"{name} must be True or False, got {value!r}")
    elif kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise UsageError(f"{name} must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    elif kind is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise UsageError(f"{name} must be a number, got {value!r}")
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            raise UsageError(f"{name} must be a string, got {value!r}")
        if choices is not None and value not in choices:
            raise UsageError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    else:  # tuple of str
        if isinstance(value, str) or not isinstance(value, (tuple, list)) \
                or not all(isinstance(v, str) for v in value):
            raise UsageError(f"{name} must be a list of names, got {value!r}")
        unknown = [v for v in value if choices is not None and v not in choices]
        if unknown:
            raise UsageError(f"{name}: unknown {', '.join(unknown)}; known: {', '.join(choices)}")
        value = tuple(value)
    return value


def parse_value(raw: str, field_type: tuple[type, bool], what: str) -> Any:
    """An option's value from its text, typed after the option (see EngineConfig.from_options)."""
    kind, optional = field_type
    low = raw.strip().lower()
    if optional and low in ("none", "null"):
        return None
    if kind is bool:
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise UsageError(f"{what}: expected a boolean (1/0, true/false, yes/no, on/off), got {raw!r}")
    if kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            raise UsageError(f"{what}: expected {'an integer' if kind is int else 'a number'}, got {raw!r}") \
                from None
    if kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw


# ------------------------------------------------------------------------------ --engine-opt ENGINE.KEY=VALUE

ENGINE_OPT_SYNTAX = "ENGINE.KEY=VALUE (e.g. onnxruntime.folder=/tmp/sd15-onnx)"
# An engine of a run is named by a label: the engine's name, or NAME@TAG for the same engine once more under options
# of its own (--engines fast,fast@fp8 --engine-opt fast@fp8.fp8=1: both in one run, each in its fresh process).
_LABEL = re.compile(r"[a-z][a-z0-9_]*(@[a-z0-9_-]+)?")


def engine_kind(label: str) -> str:
    """The engine a label runs: "fast@fp8" -> "fast", "fast" -> "fast"."""
    return label.split("@", 1)[0]


def check_engine_label(label: str, what: str) -> str:
    """`label` if it is NAME or NAME@TAG with NAME a known engine; a one-line UsageError otherwise."""
    if not _LABEL.fullmatch(label):
        raise UsageError(f"{what} {label!r}: expected an engine name or NAME@TAG (e.g. fast@fp8; TAG: letters, "
                         "digits, _ and -)")
    if engine_kind(label) not in ENGINES:
        raise UsageError(f"unknown engine {engine_kind(label)!r}; available: {', '.join(sorted(ENGINES))}")
    return label


def parse_engine_opts(items, what: str = "--engine-opt") -> dict[str, dict[str, Any]]:
    """["onnxruntime.folder=/x", "onnxruntime.cuda_graph=1"] -> {"onnxruntime": {"folder": "/x", "cuda_graph": True}}.
    ENGINE may be a NAME@TAG label ("fast@fp8.fp8=1"): options of that label only. A mapping {label: {key: value}}
    is checked the same way. Values are checked (text parsed) against the engine's Config. Bad syntax, an unknown
    engine or option, a value of the wrong type: a one-line UsageError."""
    if isinstance(items, Mapping):
        pairs = []
        for label, options in items.items():
            if not isinstance(options, Mapping):
                raise UsageError(f"engine options for {label!r} must be a mapping of option names to values")
            pairs += [(str(label).strip().lower(), key, value, f"{what} {label}.{key}={value}")
                      for key, value in options.items()]
    else:
        pairs = []
        for item in [items] if isinstance(items, str) else items or ():
            text = str(item).strip()
            target, sep, raw = text.partition("=")
            label, dot, key = target.strip().partition(".")
            label, key = label.strip().lower(), key.strip()
            if not sep or not dot or not label or not key or not key.isidentifier():
                raise UsageError(f"{what} {text!r}: expected {ENGINE_OPT_SYNTAX}")
            pairs.append((label, key, raw.strip(), f"{what} {text!r}"))
    options: dict[str, dict[str, Any]] = {}
    for label, key, value, where in pairs:
        if key in options.get(label, {}):
            raise UsageError(f"{where}: {label}.{key} is given twice")
        options.setdefault(label, {})[key] = value
    return {label: _checked_options(label, given, what) for label, given in options.items()}


def _checked_options(label: str, given: dict[str, Any], what: str) -> dict[str, Any]:
    """`given` with text values parsed, after checking them all against the engine's Config."""
    check_engine_label(label, what)
    config_class = ENGINES[engine_kind(label)].Config
    owner = f"{what}: engine {label!r}"
    try:
        config = config_class.from_options(given, what=owner, text=True)
    except UsageError as exc:
        message = str(exc)
        raise UsageError(message if message.startswith(owner) else f"{owner}: {message}") from None
    return {key: getattr(config, key) for key in given}
