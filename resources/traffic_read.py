"""Where the served traffic log lives (the reader's copy of the writer's path helpers, resources/traffic.py on the
trafficlog branch: the same functions, the lead keeps one at merge). `home` is the served profile's home
(`resources.storage.home_of(profile)`, a StorageResource's `home`)."""
from __future__ import annotations

import re
from pathlib import Path

DAY_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


def traffic_root(home: str | Path) -> Path:
    return Path(home) / "traffic"


def traffic_day_dir(home: str | Path, day: str) -> Path:
    return traffic_root(home) / day


def day_files(home: str | Path, day: str) -> list[Path]:
    """The day's log files (one per writing process), by name."""
    return sorted(traffic_day_dir(home, day).glob("*.jsonl"))


def logged_days(home: str | Path) -> list[str]:
    """The days (YYYY-MM-DD) that have a log folder, in order."""
    root = traffic_root(home)
    return sorted(p.name for p in root.iterdir() if p.is_dir() and DAY_RE.fullmatch(p.name)) if root.is_dir() else []


def day_rows(home: str | Path, day: str) -> int:
    """Whole lines logged on `day` (each ends with a newline): the size the traffic sensor compares."""
    return sum(p.read_bytes().count(b"\n") for p in day_files(home, day))


def derived_files(home: str | Path, day: str) -> list[Path]:
    """What the lineage derived from `day`'s log and keeps (the `traffic` partition: prompts and replies): deleting a
    day of traffic deletes these too (then `traffic_rewards` is refreshed without it)."""
    from resources.storage import asset_path

    return [p for p in (asset_path(home, "traffic", day), asset_path(home, "traffic", day, ".json")) if p.exists()]
