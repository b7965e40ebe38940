"""Client keys of `router-lite serve --api-keys FILE`: who may call the endpoint, and within which limits.

The file is YAML (at most MAX_KEYS_FILE_BYTES), read with the profile reader's guards (UTF-8, nesting, alias
expansion: pipeline/core/config.py) and checked at load; any problem is one `RouterLiteError` "<file>:
keys[i].<field>: <problem>":

    keys:
      - name: team-a                       # required: what the access log and the ledger call this key
        sha256: 9f86d081884c7d65...        # the key's SHA-256 hex digest (or `key: <the key itself>`, 16+ characters)
        budget_usd: 5.0                    # what its requests may cost per window (the replies' usage.cost)
        budget_window: 1d                  # rolling window: Ns, Nm, Nh or Nd (default 1d)
        rpm: 120                           # requests per rolling minute
        targets: ["quality>=0.95", parity] # the operating points it may ask for (the first: its default when
                                           # the server's default is not among them)

Only the digests are kept: `Keyring.find` hashes the bearer token and compares it with every key's digest in
constant time (`hmac.compare_digest`), so neither the key nor the time taken says which key was close.

`Keyring.reload()` reads the file again (`serve` does on SIGHUP, in every process: pipeline/serve/server.py): a valid
file replaces the keys at once (a key no longer listed is refused from the next request on: how a key is revoked),
an invalid one leaves the keys in force as they were.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import math
import re
import threading
from pathlib import Path

from pipeline.core.config import Int, Number, _read_yaml, from_yaml
from pipeline.core.errors import RouterLiteError
from pipeline.route.targets import parse_target

KEYS_ENV = "ROUTER_LITE_API_KEYS"  # names the keys file when --api-keys is not given
DEFAULT_WINDOW = "1d"
MIN_KEY_CHARS = 16  # a clear `key:` shorter than this is refused (guessable)
MAX_KEYS_FILE_BYTES = 256 * 1024  # ~2,000 keys of one line each: read again (pure-Python YAML) at every SIGHUP
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}")
_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclasses.dataclass(frozen=True)
class KeyEntry:
    """One entry of the keys file as written (the YAML schema); `ClientKey` is what the server keeps."""

    name: str = ""
    sha256: str | None = None
    key: str | None = dataclasses.field(default=None, repr=False)
    budget_usd: Number | None = None
    budget_window: str = DEFAULT_WINDOW
    rpm: Int | None = None
    targets: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class KeysFile:
    keys: tuple[KeyEntry, ...] = ()


@dataclasses.dataclass(frozen=True)
class ClientKey:
    name: str
    digest: bytes = dataclasses.field(repr=False)  # SHA-256 of the key
    budget_usd: float | None = None
    window_s: float = 86400.0
    rpm: int | None = None
    targets: tuple[str, ...] = ()  # canonical target names (parse_target(...).name); () = any

    @property
    def metered(self) -> bool:
        """Whether admitting a request needs the ledger (a budget or a rate to check)."""
        return self.budget_usd is not None or self.rpm is not None

    def budget_text(self) -> str:
        return f"${self.budget_usd:.6f} per {window_text(self.window_s)}"


def parse_window(text: str, where: str) -> float:
    """'30m' -> 1800.0: a positive number of s, m, h or d; else one error naming `where`."""
    m = _WINDOW.match(text) if isinstance(text, str) else None
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)] if m else 0.0
    if not m or not math.isfinite(seconds) or seconds < 1:
        raise RouterLiteError(f"{where}: {str(text)[:40]!r} is not a window of at least 1 s: write e.g. 30m, 12h, "
                              "1d (s, m, h, d)")
    return seconds


def window_text(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= _UNIT_S[unit] and seconds % _UNIT_S[unit] == 0:
            return f"{int(seconds // _UNIT_S[unit])}{unit}"
    return f"{seconds:g}s"


def digest_of(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


class Keyring:
    """The server's client keys (digests only), from the file `source` (checked against `allowed` targets)."""

    def __init__(self, keys: list[ClientKey], source: str = "", allowed: tuple[str, ...] = ()):
        self.keys, self.source, self.allowed = list(keys), source, tuple(allowed)
        self._reloading = threading.Lock()

    def __getstate__(self) -> dict:  # handed to each worker process of `serve --workers N` (the keys in force)
        return {k: v for k, v in vars(self).items() if k != "_reloading"}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state, _reloading=threading.Lock())

    def reload(self) -> tuple[bool, str]:
        """Read `source` again: (True, what changed) when it is valid, its keys now in force (one list swapped:
        a request being checked sees the old keys or the new, never a mix); (False, why) when it is not, the keys
        in force left as they were. The text is one line naming key names, never a key."""
        with self._reloading:
            try:
                new = load_keys(self.source, self.allowed)
            except RouterLiteError as exc:
                why = " ".join(str(exc).split())
                return False, (f"router-lite serve: keys not reloaded: {why}; the {len(self.keys)} keys in force "
                               "stay")
            old = {k.name: k for k in self.keys}
            now = {k.name: k for k in new.keys}
            self.keys = new.keys
        added = [n for n in now if n not in old]
        removed = [n for n in old if n not in now]
        changed = [n for n in now if n in old and now[n] != old[n]]
        what = "; ".join(f"{label}: {', '.join(names)}" for label, names in (("added", added), ("removed", removed),
                                                                             ("changed", changed)) if names)
        return True, (f"router-lite serve: keys reloaded from {self.source}: {len(self.keys)} keys "
                      f"({what or 'no change'})")

    def find(self, token: str | None) -> ClientKey | None:
        """The key whose digest is the token's SHA-256, comparing with every key in constant time (no early exit)."""
        if not token:
            return None
        d, found = digest_of(token), None
        for k in self.keys:
            if hmac.compare_digest(d, k.digest):
                found = k
        return found


def load_keys(path: str | Path, allowed_targets: tuple[str, ...] = ()) -> Keyring:
    """The keys file at `path`, checked (module doc); `allowed_targets` (canonical names, () = any): a key's
    `targets` must lie within the server's."""
    path = Path(path)
    raw = _read_keys_yaml(path)
    try:
        if not isinstance(raw, dict):
            raise RouterLiteError("expected a mapping with a `keys:` list")
        _no_clear_key_echo(raw)
        doc = from_yaml(KeysFile, raw, "")
        keys = [_client_key(e, f"keys[{i}]", allowed_targets) for i, e in enumerate(doc.keys)]
    except RouterLiteError as exc:
        raise RouterLiteError(f"{path}: {exc}") from None
    if not keys:
        raise RouterLiteError(f"{path}: keys: no key listed; every request would be refused (write "
                              "keys: [{name, sha256}])")
    _unique(keys, path)
    return Keyring(keys, str(path), allowed_targets)


def _read_keys_yaml(path: Path):
    """The profile reader's bounded read, with the keys file's own size limit; a syntax error is told by line and
    column only: the YAML parser's own message quotes the file's lines, which may hold a clear `key:`."""
    try:
        return _read_yaml(path, MAX_KEYS_FILE_BYTES, f"the most a keys file may hold ({MAX_KEYS_FILE_BYTES // 1024} "
                                                     "KiB, about 2,000 keys of one line each)")
    except RouterLiteError as exc:
        if "not valid YAML" not in str(exc):
            raise
    import yaml

    try:
        yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise RouterLiteError(f"{path}: not valid YAML ({exc.problem or exc.context}{where})") from None
    raise RouterLiteError(f"{path}: not valid YAML")


def _no_clear_key_echo(raw) -> None:
    """A `key:` that is not a string is refused here, before the type checker would echo its value."""
    entries = raw.get("keys")
    for i, e in enumerate(entries if isinstance(entries, list) else ()):
        if isinstance(e, dict) and e.get("key") is not None and not isinstance(e["key"], str):
            raise RouterLiteError(f"keys[{i}].key: must be a string (quote it)")


def _client_key(e: KeyEntry, where: str, allowed: tuple[str, ...]) -> ClientKey:
    if not e.name or not _NAME.fullmatch(e.name):
        raise RouterLiteError(f"{where}.name: required: letters, digits and _.@:- (at most 64), got {e.name[:40]!r}")
    if (e.sha256 is None) == (e.key is None):
        raise RouterLiteError(f"{where}: give exactly one of sha256 (the key's hex digest) or key")
    if e.sha256 is not None:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", e.sha256.strip()):
            raise RouterLiteError(f"{where}.sha256: must be 64 hex digits (printf %s \"$KEY\" | sha256sum)")
        digest = bytes.fromhex(e.sha256.strip())
    else:
        if len(e.key) < MIN_KEY_CHARS or e.key != e.key.strip():
            raise RouterLiteError(f"{where}.key: must be at least {MIN_KEY_CHARS} characters without surrounding "
                                  "spaces")
        digest = digest_of(e.key)
    if e.budget_usd is not None and e.budget_usd < 0:
        raise RouterLiteError(f"{where}.budget_usd: must be >= 0, got {e.budget_usd:g}")
    if e.rpm is not None and e.rpm < 1:
        raise RouterLiteError(f"{where}.rpm: must be >= 1 requests per minute, got {e.rpm}")
    window = parse_window(e.budget_window, f"{where}.budget_window")
    targets = []
    for j, t in enumerate(e.targets):
        try:
            name = parse_target(t).name
        except RouterLiteError as exc:
            raise RouterLiteError(f"{where}.targets[{j}]: {exc}") from None
        if allowed and name not in allowed:
            raise RouterLiteError(f"{where}.targets[{j}]: {name} is not among the server's --allowed-targets "
                                  f"({', '.join(allowed)})")
        targets.append(name)
    return ClientKey(e.name, digest, e.budget_usd, window, e.rpm, tuple(dict.fromkeys(targets)))


def _unique(keys: list[ClientKey], path: Path) -> None:
    names, digests = {}, {}
    for i, k in enumerate(keys):
        if k.name in names:
            raise RouterLiteError(f"{path}: keys[{i}].name: {k.name!r} is also keys[{names[k.name]}]'s")
        if k.digest in digests:
            raise RouterLiteError(f"{path}: keys[{i}]: the same key as keys[{digests[k.digest]}]")
        names[k.name], digests[k.digest] = i, i


def parse_targets(text: str | None, where: str = "--allowed-targets") -> tuple[str, ...]:
    """'a,b' -> canonical target names; None / '' -> () (any)."""
    if not text or not text.strip():
        return ()
    out = []
    for part in text.split(","):
        if not part.strip():
            raise RouterLiteError(f"{where}: an empty target in {text[:80]!r}")
        try:
            out.append(parse_target(part.strip()).name)
        except RouterLiteError as exc:
            raise RouterLiteError(f"{where}: {exc}") from None
    return tuple(dict.fromkeys(out))
