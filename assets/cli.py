"""The `router-lite` command line: what people do outside the Dagster UI.

Each subcommand imports only what it needs, so `router-lite route` does not pay for importing Dagster.
"""
import argparse
import json
import logging
import os
import sys

from pipeline.errors import RouterLiteError


def cmd_run(args) -> int:
    if args.profile:
        os.environ["ROUTER_LITE_PROFILE"] = args.profile
    from assets.definitions import build_definitions
    from assets.report import print_summary
    from assets.run import run_lineage
    from resources.storage import default_home

    defs = build_definitions(profile=args.profile or "")
    run_lineage(defs, args.profile, args.upto, log=lambda m: print(m, file=sys.stderr, flush=True))
    print_summary(default_home(), args.profile)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="router-lite", description=__doc__)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="materialise the whole lineage for a profile (default: demo)")
    p.add_argument("--profile", default=None, help="config/profiles/<name>.yaml (default: $ROUTER_LITE_PROFILE or demo)")
    p.add_argument("--upto", default=None, help="stop after the stage holding this asset (e.g. task_pool)")
    p.set_defaults(fn=cmd_run)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except RouterLiteError as exc:
        print(f"router-lite: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
