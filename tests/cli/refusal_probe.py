"""Run ``nobubble ARGV...`` in this process, then write what it left: run as a script,
``python refusal_probe.py REPORT.json ARGV...``; exits with the command's status.

The report says whether the command imported torch and which of this process's children are
still alive (a refusal must start none), read after ``main`` returned."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def live_children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):  # gone meanwhile
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


if __name__ == "__main__":
    from nobubble.cli import main

    try:
        rc = main(sys.argv[2:])
    except SystemExit as exc:  # argparse's refusals
        rc = exc.code if isinstance(exc.code, int) else 1
    report = {"torch": "torch" in sys.modules, "children": live_children(os.getpid())}
    Path(sys.argv[1]).write_text(json.dumps(report))
    sys.exit(rc)
