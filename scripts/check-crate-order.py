#!/usr/bin/env python3
"""Fail unless docs/ARCHITECTURE.md's crate table matches the workspace.

The table under "## Crates and the direction of their dependencies" gives each crate a row
number and the workspace crates it depends on. For every workspace member, from
`cargo metadata --no-deps`, this checks that it has a row, that its normal (non-dev,
non-build) dependencies on workspace crates are exactly the ones the row names, and that
each of them has a smaller row number: dependencies point up the table only.

Usage: scripts/check-crate-order.py
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADING = "## Crates and the direction of their dependencies"


def table_rows(text):
    """{crate: (row, {deps named})} from the table after HEADING."""
    start = text.index(HEADING)
    rows = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        m = re.match(r"^\|\s*(\d+)\s*\|\s*`([\w-]+)`\s*\|([^|]*)\|", line)
        if m:
            # Crate names are in backticks and start with braid (a feature named beside one,
            # like `fault-injection`, is not a crate).
            named = {n for n in re.findall(r"`([\w-]+)`", m.group(3)) if n.startswith("braid")}
            rows[m.group(2)] = (int(m.group(1)), named)
    return rows


def main():
    with open(os.path.join(ROOT, "docs", "ARCHITECTURE.md")) as f:
        rows = table_rows(f.read())
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = {p["name"]: p for p in meta["packages"]}
    errors = []
    for name, pkg in sorted(members.items()):
        if name not in rows:
            errors.append(f"{name}: no row in the table of docs/ARCHITECTURE.md")
            continue
        row, named = rows[name]
        deps = {
            d["name"]
            for d in pkg["dependencies"]
            if d["kind"] is None and d["name"] in members and d["name"] != name
        }
        if deps != named:
            errors.append(
                f"{name}: depends on {sorted(deps) or 'no workspace crate'}, "
                f"the table says {sorted(named) or 'none'}"
            )
        for d in sorted(deps):
            if d in rows and rows[d][0] >= row:
                errors.append(f"{name} (row {row}) depends on {d} (row {rows[d][0]}): not above it")
    for name in sorted(set(rows) - set(members)):
        errors.append(f"{name}: in the table but not a workspace member")
    for e in errors:
        print(f"check-crate-order: {e}", file=sys.stderr)
    if errors:
        return 1
    print(f"check-crate-order: {len(members)} crates, dependencies point up the table only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
