"""The typed-YAML reader under every profile (the typed profile itself is `pipeline/profile.py`, above the stages).

`from_yaml(cls, raw)` reads a YAML mapping into a frozen dataclass: the dataclass fields are the known keys and
their type hints the types; only lossless readings are made; any failure is one `RouterLiteError`
"<dotted key>: <problem>". `_read_yaml(path)` reads one file within bounds (size, UTF-8, depth, values with aliases
expanded); `profile_path(name)` / `override_path()` find the profile and the override file (`OVERRIDE_ENV`);
`merged(base, over)` merges the override over the profile. Nothing here knows a stage: each stage keeps its own
option class and `pipeline/profile.py` assembles them.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.core.errors import RouterLiteError

DEFAULT_PROFILE = "demo"
OVERRIDE_ENV = "ROUTER_LITE_OVERRIDE"  # a YAML file merged over the active profile (module doc)


def config_dir() -> Path:
    return Path(os.environ.get("ROUTER_LITE_CONFIG", Path(__file__).resolve().parents[2] / "config"))


def active_profile_name() -> str:
    return os.environ.get("ROUTER_LITE_PROFILE", DEFAULT_PROFILE)


# --- the option tables: each option class's docstring, pycma style --------------------------------------------------
_OPTION = re.compile(r"^ {4}(\w+) = (.*)$")


def option_table(cls: type) -> list[tuple[str, str, str]]:
    """(option, default as written, meaning) for each `name = default` entry of the docstrings of `cls` and its
    dataclass bases, in order; the meaning is the entry's 8-space indented lines joined. The one reading of these
    tables: the docs generator (`scripts/readme.py`) and the command line's help take them from here."""
    rows: list[tuple[str, str, list[str]]] = []
    for c in cls.__mro__:
        if not dataclasses.is_dataclass(c):
            continue
        for line in (c.__doc__ or "").splitlines():
            m = _OPTION.match(line)
            if m:
                rows.append((m.group(1), m.group(2).strip(), []))
            elif rows and line.startswith(" " * 8) and line.strip():
                rows[-1][2].append(line.strip())
            elif rows and not line.strip():
                rows.append(("", "", []))  # a blank line ends the entry
    return [(name, default, " ".join(meaning)) for name, default, meaning in rows if name]


# --- the one validator --------------------------------------------------------------------------------------------
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxdict, _SHOW.maxlist, _SHOW.maxtuple, _SHOW.maxstring, _SHOW.maxother = 2, 4, 4, 4, 60, 60


def _what(value: Any) -> str:
    """A value in an error message: its type and a repr cut *while* rendering (a YAML alias bomb's value is a
    graph of shared lists whose full repr would not fit in memory)."""
    return "null" if value is None else f"{type(value).__name__} {_SHOW.repr(value)}"[:80]


def _join(key: str, name: Any) -> str:
    return f"{key}.{name}" if key else str(name)


def from_yaml(cls: type, raw: Any, key: str = "") -> Any:
    """An instance of dataclass `cls` from the YAML mapping `raw` found at dotted `key`: every key must be a field,
    every value must fit the field's type hint (`_coerce`). The dataclass's own checks (`__post_init__`, and
    `validate()` where it has one) run last. Errors: one `RouterLiteError` "<dotted key>: <problem>"."""
    if raw is None:  # an empty section (`train:`) means every default
        raw = {}
    if not isinstance(raw, dict):
        raise RouterLiteError(f"{key or 'the profile'}: expected a mapping, got {_what(raw)}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init and f.metadata.get("yaml", True)}
    for name in raw:
        if name not in known:
            raise RouterLiteError(f"{_join(key, name)}: unknown key; known: {', '.join(known)}")
    values = {name: _coerce(hints[name], value, _join(key, name), known[name].metadata)
              for name, value in raw.items()}
    obj = cls(**values)
    if callable(getattr(obj, "validate", None)):
        obj.validate()
    return obj


def _coerce(tp: Any, value: Any, key: str, meta: typing.Mapping = types.MappingProxyType({})) -> Any:
    """`value` as type `tp`, or a RouterLiteError naming `key`. Only lossless conversions: an integral float for an
    int, an int or a numeric string for a float (PyYAML reads `1e-3` as a string), a list for a tuple; a string is
    never a number of an int field, and nothing is ever turned into a string or a bool."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if value is None and len(options) < len(args):
            return None
        problems = []
        for option in options:
            try:
                return _coerce(option, value, key)
            except RouterLiteError as exc:
                problems.append(str(exc))
        raise RouterLiteError(problems[0] if len(problems) == 1 else f"{key}: expected one of {tp}, got {_what(value)}")
    if origin is Literal:
        if value in args and isinstance(value, str):
            return value
        raise RouterLiteError(f"{key}: {_what(value)} is not one of {', '.join(map(str, args))}")
    if dataclasses.is_dataclass(tp):
        return from_yaml(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise RouterLiteError(f"{key}: expected true or false, got {_what(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise RouterLiteError(f"{key}: expected an integer, got {_what(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = value  # an int stays an int: `top_p: 1` keeps the call-settings hash it always had
        else:
            try:
                number = float(value) if isinstance(value, str) else None
            except ValueError:
                number = None
        if number is None:
            raise RouterLiteError(f"{key}: expected a number, got {_what(value)}")
        if not math.isfinite(number):  # `.nan` / `.inf` reach no JSON body, no optimiser, no timeout
            raise RouterLiteError(f"{key}: expected a finite number, got {_what(value)}")
        return number
    if tp is str:
        choices = meta.get("choices")
        choices = list(choices()) if callable(choices) else choices
        if isinstance(value, str) and (choices is None or value in choices):
            return value
        if isinstance(value, str):
            raise RouterLiteError(f"{key}: {_what(value)} is not one of {', '.join(choices)}")
        raise RouterLiteError(f"{key}: expected a string, got {_what(value)}")
    if tp is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise RouterLiteError(f"{key}: expected a list, got {_what(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
        return tuple(value)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise RouterLiteError(f"{key}: expected a mapping, got {_what(value)}")
        allowed = meta.get("keys")
        allowed = list(allowed()) if callable(allowed) else allowed
        for k in value:
            if allowed is not None and k not in allowed:
                raise RouterLiteError(f"{_join(key, k)}: unknown key; known: {', '.join(allowed)}")
        if not args:
            return dict(value)
        return {_coerce(args[0], k, _join(key, k)): _coerce(args[1], v, _join(key, k)) for k, v in value.items()}
    raise TypeError(f"{key}: no YAML reading for type {tp!r}")  # a schema bug, not a user error


# --- loading ------------------------------------------------------------------------------------------------------
MAX_PROFILE_BYTES = 1 << 20  # a profile file is a page of YAML; anything bigger is refused before parsing
MAX_PROFILE_VALUES = 100_000  # values in the document with YAML aliases expanded (a "billion laughs" is refused)
MAX_PROFILE_DEPTH = 64  # nesting of mappings and lists
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def _expanded_values(raw: Any) -> None:
    """Refuse a document that holds more than MAX_PROFILE_VALUES values once its aliases are expanded, nests
    deeper than MAX_PROFILE_DEPTH or refers to itself (counted on the shared graph: linear in the file's size)."""
    sizes: dict[int, int | None] = {}

    def size(v: Any, depth: int) -> int:
        if not isinstance(v, (list, dict)):
            return 1
        if depth > MAX_PROFILE_DEPTH:
            raise RouterLiteError(f"nested deeper than {MAX_PROFILE_DEPTH} levels")
        if id(v) in sizes:
            if sizes[id(v)] is None:
                raise RouterLiteError("a YAML alias refers to the value that contains it")
            return sizes[id(v)]
        sizes[id(v)] = None
        n = 1
        for x in (v.values() if isinstance(v, dict) else v):
            n += size(x, depth + 1)
            if n > MAX_PROFILE_VALUES:
                raise RouterLiteError(f"holds more than {MAX_PROFILE_VALUES:,} values once its YAML aliases are "
                                      "expanded (an alias bomb?)")
        sizes[id(v)] = n
        return n

    size(raw, 0)


def _read_yaml(path: Path) -> Any:
    """The one read of a profile file (a test counts these): at most MAX_PROFILE_BYTES of UTF-8 YAML, within the
    nesting and alias-expansion bounds; anything else is one RouterLiteError naming the file."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise RouterLiteError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > MAX_PROFILE_BYTES:
        raise RouterLiteError(f"{path}: larger than {MAX_PROFILE_BYTES:,} bytes; a profile is a short YAML file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RouterLiteError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") \
            from None
    try:
        raw = yaml.safe_load(text)
    except RecursionError:
        raise RouterLiteError(f"{path}: nested deeper than {MAX_PROFILE_DEPTH} levels") from None
    except yaml.YAMLError as exc:
        raise RouterLiteError(f"{path}: not valid YAML ({exc})") from None
    try:
        _expanded_values(raw)
    except RouterLiteError as exc:
        raise RouterLiteError(f"{path}: {exc}") from None
    return raw


def profile_path(name: str) -> Path:
    """config/profiles/<name>.yaml for a profile *name* (letters, digits, `_`, `-`, `.`; no path): a profile
    elsewhere is read only through the explicit option ROUTER_LITE_CONFIG (another config directory)."""
    profiles = config_dir() / "profiles"
    if not isinstance(name, str) or not _PROFILE_NAME.fullmatch(name) or ".." in name:
        raise RouterLiteError(f"profile {str(name)[:100]!r} is not a profile name (letters, digits, '_', '-', '.'; "
                              f"no path): profiles are read from {profiles}; set ROUTER_LITE_CONFIG to use another "
                              "config directory")
    path = profiles / f"{name}.yaml"
    if path.exists() and not path.resolve().is_relative_to(profiles.resolve()):
        raise RouterLiteError(f"profile {name!r}: {path} leads outside {profiles} (a symlink)")
    return path


def override_path() -> Path | None:
    """The override file named by ROUTER_LITE_OVERRIDE (None when unset); a missing file is an error."""
    value = os.environ.get(OVERRIDE_ENV, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise RouterLiteError(f"{OVERRIDE_ENV}={value}: no such file (a YAML mapping merged over the profile)")
    return path


OVERRIDE_AGENTS = "agents"  # the override file's section of agent pools (merged over config/agents.yaml's `pools`)


def override_pools() -> dict:
    """The agent pools an override file adds or replaces (`agents: {pools: {NAME: {...}}}`, the shape of
    config/agents.yaml), {} when there is no override or it has no `agents:`; a malformed section is one error naming
    the file."""
    path = override_path()
    if path is None:
        return {}
    raw = _read_yaml(path)
    section = raw.get(OVERRIDE_AGENTS) if isinstance(raw, dict) else None
    if section is None:
        return {}
    if not isinstance(section, dict) or set(section) - {"pools"} or not isinstance(section.get("pools"), dict):
        raise RouterLiteError(f"override {path}: `agents:` must be a mapping with one key, `pools:` (pool name -> "
                              "{provider, base_url, extends?, agents: [{name, model, ...}]}, as in config/agents.yaml)")
    for name, pool in section["pools"].items():
        if not isinstance(pool, dict):
            raise RouterLiteError(f"override {path}: agents.pools.{name} must be a mapping, got {_what(pool)}")
    return dict(section["pools"])


def merged(base: Any, over: Any) -> Any:
    """`over` merged over `base`: mappings key by key (recursively), anything else replaced by `over`."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: merged(base.get(k), v) if k in base else v for k, v in over.items()}}
    return over
