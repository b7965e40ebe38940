"""The typed-YAML reader under every profile (the typed profile itself is `pipeline/profile.py`, above the stages).

`from_yaml(cls, raw)` reads a YAML mapping into a frozen dataclass through pydantic: the dataclass fields are the
known keys and their annotated types (`Int`, `Number`, `Flag`, `one_of`, `pydantic.Field` bounds) the types; only
lossless readings are made; pydantic's first error is one `RouterLiteError` "<dotted key>: <problem>, got <value>"
(`check_fields` checks a section built in code the same way). `_read_yaml(path)` reads one file within bounds (size,
UTF-8, depth, values with aliases expanded); `profile_path(name)` / `override_path()` find the profile and the
override file (`OVERRIDE_ENV`); `merged(base, over)` merges the override over the profile. Nothing here knows a
stage: each stage keeps its own option class and `pipeline/profile.py` assembles them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import numbers
import os
import re
import reprlib
import typing
from pathlib import Path
from typing import Annotated, Any

import pydantic
import yaml
from pydantic_core import PydanticCustomError

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


# --- the YAML types: pydantic reads a profile; these say what a YAML value may be -------------------------------
T = typing.TypeVar("T")
_YAML = pydantic.ConfigDict(extra="forbid")  # an unknown key anywhere is refused (nested dataclasses inherit it)


def _integral(value: Any) -> Any:
    """YAML's `8.0` (and numpy's integers, in code) as the int they are; a bool stays a bool (refused)."""
    lossless = isinstance(value, float) and value.is_integer() or isinstance(value, numbers.Integral)
    return int(value) if lossless and not isinstance(value, bool) else value


def _number(value: Any, handler: Any) -> Any:
    if type(value) is int:  # an int stays an int: `top_p: 1` keeps the call-settings hash it always had
        return value
    with contextlib.suppress(ValueError):  # PyYAML reads `1e-3` as a string
        value = float(value) if isinstance(value, str) else value
    return handler(value)


Int = Annotated[int, pydantic.Strict(), pydantic.BeforeValidator(_integral)]  # never a bool, never a string
Number = Annotated[float, pydantic.Strict(), pydantic.AllowInfNan(False), pydantic.WrapValidator(_number)]
Flag = pydantic.StrictBool
Section = Annotated[T, pydantic.BeforeValidator(lambda v: {} if v is None else v)]  # `train:` alone: the defaults


def one_of(names: Any, key: bool = False) -> pydantic.AfterValidator:
    """A string among `names` (a callable: a list read at each check, so a kind registered later counts); `key`:
    the string is a mapping's key, and any other is an unknown key."""
    def check(value: str) -> str:
        known = list(names() if callable(names) else names)
        if value not in known:
            raise PydanticCustomError("unknown_key" if key else "not_one_of", "not one of {known}",
                                      {"known": ", ".join(known)})
        return value
    return pydantic.AfterValidator(check)


def code_only(value: Any) -> Any:
    """An `AfterValidator` for a field set by code, never by the file: any value written is an unknown key."""
    raise PydanticCustomError("unknown_key", "not a key")


# --- pydantic's errors as one line --------------------------------------------------------------------------------
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxdict, _SHOW.maxlist, _SHOW.maxtuple, _SHOW.maxstring, _SHOW.maxother = 2, 4, 4, 4, 60, 60
_SAYS = {"int_type": "expected an integer", "float_type": "expected a number", "finite_number":
         "expected a finite number", "bool_type": "expected true or false", "string_type": "expected a string",
         "tuple_type": "expected a list", "dict_type": "expected a mapping", "dataclass_type": "expected a mapping",
         "greater_than_equal": "must be >= {ge}", "greater_than": "must be > {gt}", "less_than_equal":
         "must be <= {le}", "less_than": "must be < {lt}", "too_short": "must hold at least {min_length} value(s)"}


def _what(value: Any) -> str:
    """A value in an error message: its type and a repr cut *while* rendering (a YAML alias bomb's value is a
    graph of shared lists whose full repr would not fit in memory)."""
    return "null" if value is None else f"{type(value).__name__} {_SHOW.repr(value)}"[:80]


def _join(key: str, name: Any) -> str:
    return f"{key}[{name}]" if isinstance(name, int) else f"{key}.{name}" if key else str(name)


def _yaml_keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init and f.metadata.get("yaml", True)]


def _keys_at(cls: type, loc: tuple) -> list[str]:
    """The keys the dataclass at `loc` (a path through dataclasses, lists and mappings) knows."""
    tp = cls
    for part in loc:
        tp = typing.get_type_hints(tp)[part] if dataclasses.is_dataclass(tp) else \
            typing.get_args(tp)[0 if isinstance(part, int) else -1]
        if type(None) in typing.get_args(tp):  # `X | None`
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return _yaml_keys(tp)


def _one_line(exc: pydantic.ValidationError, cls: type, key: str, skip: int = 0) -> RouterLiteError:
    """pydantic's first error as the one line "<dotted key>: <problem>, got <value>" (`skip`: the wrapper's part
    of the error's path)."""
    err = exc.errors()[0]
    loc = tuple(p for p in err["loc"][skip:] if p != "[key]")
    kind, ctx, where = err["type"], err.get("ctx") or {}, key
    for part in loc:
        where = _join(where, part)
    if kind == "value_error":  # a section's own check (`__post_init__`): its message names its key
        return RouterLiteError(str(ctx["error"]))
    if kind in ("unknown_key", "unexpected_keyword_argument"):
        known = ctx.get("known") or ", ".join(_keys_at(cls, loc[:-1]))
        return RouterLiteError(f"{where}: unknown key; known: {known}")
    if kind in ("not_one_of", "literal_error"):
        known = ctx.get("known") or ", ".join(re.findall(r"'(.*?)'", ctx["expected"]))
        return RouterLiteError(f"{where}: {_what(err['input'])} is not one of {known}")
    says = _SAYS[kind].format(**ctx) if kind in _SAYS else err["msg"]
    return RouterLiteError(f"{where or 'the profile'}: {says}, got {_what(err['input'])}")


@functools.cache
def _reader(cls: type) -> type[pydantic.BaseModel]:
    return pydantic.create_model(f"{cls.__name__}File", __config__=_YAML, section=(Section[cls], ...))


def from_yaml(cls: type, raw: Any, key: str = "") -> Any:
    """An instance of dataclass `cls` from the YAML mapping `raw` found at dotted `key`, read by pydantic: every
    key must be a field and every value fit the field's annotated type (`Int`, `Number`, `Flag`, `one_of`, bounds);
    the dataclasses' own `__post_init__` checks run as pydantic builds them. Errors: one `RouterLiteError`
    "<dotted key>: <problem>"."""
    try:
        return _reader(cls).model_validate({"section": raw}).section
    except pydantic.ValidationError as exc:
        raise _one_line(exc, cls, key, 1) from None


@functools.cache
def _field_readers(cls: type) -> dict[str, pydantic.TypeAdapter]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {name: pydantic.TypeAdapter(hints[name]) for name in _yaml_keys(cls)}


def check_fields(obj: Any, key: str) -> None:
    """The fields of dataclass `obj` built in code (a YAML read checks them on the way in) against their annotated
    types and bounds: the first that does not fit is one `RouterLiteError` "<key>.<field>: <problem>"."""
    for name, reader in _field_readers(type(obj)).items():
        try:
            reader.validate_python(getattr(obj, name))
        except pydantic.ValidationError as exc:
            raise _one_line(exc, type(obj), _join(key, name)) from None


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


def _read_yaml(path: Path, max_bytes: int = MAX_PROFILE_BYTES, what: str = "a profile is a short YAML file") -> Any:
    """The one read of a profile file (a test counts these): at most `max_bytes` of UTF-8 YAML, within the
    nesting and alias-expansion bounds; anything else is one RouterLiteError naming the file (a larger one: `what`
    says why it may not be). Other YAML files read with the same guards pass their own limit and reason."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise RouterLiteError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if len(data) > max_bytes:
        raise RouterLiteError(f"{path}: larger than {max_bytes:,} bytes; {what}")
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
