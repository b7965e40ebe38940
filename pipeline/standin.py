"""The local OpenRouter stand-in's command line (`python -m pipeline.standin`, `make standin`): the server is
pipeline/collect/standin.py; this module only adds what needs a profile (the tasks it knows the answers of), so it
sits above the stages like pipeline/profile.py.

    python -m pipeline.standin --port 8765 --write-override standin.yaml
    router-lite run --profile pilot --override standin.yaml
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from pipeline.collect.standin import StandInServer, pool_standin
from pipeline.core.errors import RouterLiteError
from pipeline.profile import load_profile


def profile_tasks(profile: str) -> list[dict]:
    """Every task of the profile's sources (not only the pool's sample: any pool size is answered)."""
    from pipeline.tasks.sources import load_source

    rows: list[dict] = []
    for key, src in load_profile(profile).sources.items():
        df = load_source(key, path=src.path, hub_id=src.hub_id, hub_config=src.hub_config, hub_split=src.hub_split)
        rows += df.to_dict("records")
    return rows


def _standin(args):
    """The stand-in the command's arguments describe: the pool's models (and the profile's judge), the profile's
    tasks, the faults file, the recordings with --recorded."""
    faults = None
    if args.faults:
        import yaml

        faults = yaml.safe_load(Path(args.faults).read_text())
    tasks = profile_tasks(args.profile) if args.profile else []
    judge = getattr(load_profile(args.profile).collection.judge, "model", None) if args.profile else None
    recorded = None
    if args.recorded:
        from pipeline.collect.replay import ReplayStore

        recorded = ReplayStore.load()
    return pool_standin(args.pool, tasks, judge=judge, key=os.environ.get(args.key_env) or None, faults=faults,
                        seed=args.seed, latency_ms=args.latency_ms, price_factor=args.price_factor, recorded=recorded)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.standin",
                                 description="A local OpenRouter stand-in on 127.0.0.1 (pipeline/collect/standin.py).")
    ap.add_argument("--port", type=int, default=8765, help="TCP port on 127.0.0.1 (0: a free one)")
    ap.add_argument("--pool", default="pilot", help="the pool of config/agents.yaml whose model ids it answers")
    ap.add_argument("--profile", default="pilot", help="the profile whose bundled sources it knows the answers of")
    ap.add_argument("--key-env", default="OPENROUTER_API_KEY",
                    help="require this variable's value as the bearer key (when it is set; else any key)")
    ap.add_argument("--faults", default=None, help="a YAML/JSON file: {model id: {fault: value}} (module doc)")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--price-factor", type=float, default=1.0, help="reported cost = list price x tokens x this")
    ap.add_argument("--recorded", action="store_true",
                    help="answer with the bundled recordings where they have a reply (AlpacaEval's included), and as "
                         "the profile's judge (collection.judge.model) with the recorded judgments, log-probabilities "
                         "included (e.g. --pool chat --profile chat)")
    ap.add_argument("--override", default=None, metavar="FILE",
                    help="an override file whose `agents: {pools: ...}` adds pools (e.g. --pool my_pool); "
                         "--write-override then writes it merged with the endpoint")
    ap.add_argument("--write-override", default=None, metavar="FILE",
                    help="write the profile override pointing at this server to FILE")
    args = ap.parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"standin: error: --port {args.port} is not a TCP port", file=sys.stderr)
        return 2
    try:
        if args.override:  # read wherever a profile or agent pool is loaded in this process
            from pipeline.core.config import OVERRIDE_ENV, override_path

            os.environ[OVERRIDE_ENV] = str(Path(args.override).expanduser().resolve())
            override_path()  # a missing file: one error
        standin = _standin(args)
        server = StandInServer(standin, args.port)
    except (RouterLiteError, OSError) as exc:
        print(f"standin: error: {exc}", file=sys.stderr)
        return 2
    override = server.override()
    if args.write_override:
        import yaml

        from pipeline.core.config import merged

        base = yaml.safe_load(Path(args.override).read_text()) if args.override else {}
        Path(args.write_override).write_text(yaml.safe_dump(merged(base or {}, override), sort_keys=False))
    print(f"listening {server.base_url} ({len(standin.models)} models of pool {args.pool!r}, "
          f"{len(standin.tasks)} known tasks); profile override:\n{json.dumps(override)}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
