"""`tirl config migrate FILE [--out FILE]`: an older config file (a run's config.yaml) rewritten in the current keys.

A renamed key is refused by the loader with its new name (`MOVED_KEYS`, `tirl.core.config`); this command makes the
move for a whole file (`tirl.core.migrate.migrate_data`), so an old run directory stays usable: its config.yaml loads
again and `--resume` continues it (a resume checks the data and the settings the checkpoint recorded, none of which
moved). The migrated file is checked to load before it is written; comments of a hand-written file are not kept.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from tirl.commands.run_config import TirlConfig
from tirl.core.config import from_dict, read_config_file
from tirl.core.io import atomic_write_text, check_output_path
from tirl.core.migrate import migrate_data


def migrate_file(path: str | Path, out: str | Path | None = None) -> list[str]:
    """Write `path`'s config in the current keys to `out` (default: `path` itself, only when something changed);
    returns one line per change."""
    target = check_output_path(out if out is not None else path)
    data, notes = migrate_data(TirlConfig, read_config_file(path))
    from_dict(TirlConfig, TirlConfig.resolve_data(data))  # a migrated file that would not load is not written
    if notes or out is not None:
        atomic_write_text(target, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return notes


def _cmd_migrate(args: argparse.Namespace) -> int:
    notes = migrate_file(args.file, args.out)
    where = args.out or args.file
    for note in notes:
        print(f"  {note}")
    print(f"{where}: {'migrated' if notes else 'already in the current keys'}")
    return 0


def add_config_parser(sub: argparse._SubParsersAction) -> None:
    config = sub.add_parser(
        "config", help="config files: migrate an older one to the current keys"
    ).add_subparsers(dest="config_command", required=True)
    p = config.add_parser(
        "migrate",
        help="rewrite an older config file (a run's config.yaml) in the current keys: renamed keys moved, settings "
        "the new place does not have dropped, each change printed",
    )
    p.add_argument("file", help="the config file")
    p.add_argument(
        "--out", default=None, help="write the migrated config here (default: rewrite FILE in place)"
    )
    p.set_defaults(fn=_cmd_migrate)
