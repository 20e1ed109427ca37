"""``python -m gpufleet.common.trust.issue``: a deployment's CA and its parts' certificates,
for an init step (docker-compose's ``certs``) or by hand.

Each part gets a folder of its own — ``<dir>/<part>/{ca.crt,tls.crt,tls.key}`` — so a
container mounts only its own key; the provisioner's folder also holds the machine CA
(``machine-ca.crt``, ``machine-ca.key``) it gives new machines their certificates with.
The CA itself stays in ``<dir>/ca`` and is mounted nowhere. Idempotent: what exists is kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles


def part_folder(root: Path, authority: Authority, who: Identity, owner: int | None) -> Path:
    name = str(who).replace(":", "-")
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")
    if not files.cert.exists():
        authority.issue(who, files)
    if who.role is Role.PROVISIONER:
        for src in ("machine-ca.crt", "machine-ca.key"):
            if not (folder / src).exists():
                shutil.copy2(authority.folder / src, folder / src)
    if owner is not None:
        for path in (folder, *folder.iterdir()):
            os.chown(path, owner, owner)
    os.chmod(folder, 0o700)
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpufleet.common.trust.issue", description=__doc__.splitlines()[0]
    )
    p.add_argument("--dir", required=True, type=Path, help="where the CA and the parts' folders go")
    p.add_argument("--deployment", required=True, help="the deployment id (GPUFLEET_DEPLOYMENT_ID)")
    p.add_argument(
        "--parts",
        default="scheduler,reaper,sweeper,provisioner,operator,backend",
        help="comma-separated roles, or machine:<id> (default: every control-plane part)",
    )
    p.add_argument("--owner", type=int, default=None, help="uid (and gid) to own each part's folder")
    args = p.parse_args(argv)
    try:
        authority = Authority.ensure(args.dir / "ca", args.deployment)
        for text in filter(None, (t.strip() for t in args.parts.split(","))):
            folder = part_folder(args.dir, authority, Identity.parse(text, args.deployment), args.owner)
            print(f"{text}: {folder}")
    except ValueError as exc:
        print(f"gpufleet certs: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
