"""Checks the declared rust-version without an old toolchain (only a newer one is here).

Reads `cargo metadata --format-version 1` on stdin. Fails if a published workspace
crate declares no rust-version, or if a package its users or its tests build (normal
and build dependencies, transitively, plus its own dev-dependencies and theirs)
declares a newer one than it: then ours would be a lie. The std API side is clippy's
`incompatible_msrv` lint (in [workspace.lints]); edition 2024 and let-chains alone
need 1.88.
"""

import json
import sys


def version(text):
    return tuple(int(part) for part in text.split("."))


meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
deps = {n["id"]: n["deps"] for n in meta["resolve"]["nodes"]}
published = [i for i in meta["workspace_members"] if packages[i]["publish"] != []]

failures = []
for root in published:
    crate = packages[root]
    if not crate["rust_version"]:
        failures.append(f"{crate['name']}: no rust-version")
        continue
    ours = version(crate["rust_version"])
    seen, stack, newest = set(), [(root, True)], (0,)
    while stack:
        node, is_root = stack.pop()
        for dep in deps[node]:
            kinds = {k["kind"] for k in dep["dep_kinds"]}
            wanted = {None, "build", "dev"} if is_root else {None, "build"}
            if kinds & wanted and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                stack.append((dep["pkg"], False))
    for dep in sorted(seen):
        p = packages[dep]
        if p["rust_version"]:
            newest = max(newest, version(p["rust_version"]))
            if version(p["rust_version"]) > ours:
                failures.append(
                    f"{crate['name']} declares rust-version {crate['rust_version']}, "
                    f"but {p['name']} {p['version']} needs {p['rust_version']}"
                )
    print(
        f"{crate['name']}: rust-version {crate['rust_version']}; {len(seen)} packages "
        f"in its tree, the newest needs {'.'.join(map(str, newest))}"
    )

if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)
