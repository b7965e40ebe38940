"""The served traffic log as the lineage reads it (its layout, and what deleting a day deletes, are
resources/traffic.py's): `home` is the served profile's home (`resources.storage.home_of(profile)`)."""
from __future__ import annotations

from pathlib import Path

from resources.traffic import DAY_RE, derived_files, traffic_day_dir, traffic_root  # noqa: F401 (one layout)


def day_files(home: str | Path, day: str) -> list[Path]:
    """The day's log files (one per writing process), by name."""
    return sorted(traffic_day_dir(home, day).glob("*.jsonl"))


def logged_days(home: str | Path) -> list[str]:
    """The days (YYYY-MM-DD) that have a log folder, in order."""
    root = traffic_root(home)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and DAY_RE.fullmatch(p.name)) if root.is_dir() else []


def day_bytes(home: str | Path, day: str) -> int:
    """The day's log size in bytes (a stat per file): the sensor counts lines again only when it changed."""
    return sum(p.stat().st_size for p in day_files(home, day))


def day_rows(home: str | Path, day: str) -> int:
    """Whole lines logged on `day` (each ends with a newline): the size the traffic sensor compares."""
    return sum(p.read_bytes().count(b"\n") for p in day_files(home, day))
