"""``python -m gpufleet.common.trust.issue``: a deployment's CA and its parts' certificates,
for an init step (docker-compose's ``certs``), the Kubernetes certs Job
(``deploy/kubernetes/components/certs-job``) or by hand. It is in every gpufleet image
(``libs/common``), where the ``gpufleet`` CLI is not.

Each part gets a folder of its own — ``<dir>/<part>/{ca.crt,tls.crt,tls.key}`` — so a
container mounts only its own key; the provisioner's folder also holds the machine CA
(``machine-ca.crt``, ``machine-ca.key``) it gives new machines their certificates with.
The CA itself stays in ``<dir>/ca`` and is mounted nowhere. Run again, it keeps what is
good and renews what is due (:meth:`Authority.due`): none yet, a third of its life or less
left, another CA's key, or names other than its own; a running part takes the new files
without a restart.

``--ca-from`` seeds ``<dir>/ca`` from a folder holding a CA (the Job's mounted
``gpufleet-ca`` Secret); ``--kubernetes-secrets DIR`` also writes each part's files as a
Secret manifest into ``DIR`` (for ``kubectl apply -f DIR``): ``gpufleet-<part>-tls`` with
``tls.crt``, ``tls.key`` and ``ca.crt`` — the keys cert-manager writes — and the machine CA
as ``gpufleet-machine-ca``. The CA is kept as ``gpufleet-ca`` in the layout of a
cert-manager CA Issuer's Secret (``tls.crt``, ``tls.key``: the root), with the machine CA's
files and the deployment id beside them: moving to cert-manager later keeps the same root.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
from pathlib import Path

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles

CA_FILES = ("ca.crt", "ca.key", "machine-ca.crt", "machine-ca.key", "deployment")
# The CA folder's files under the keys of the gpufleet-ca Secret (a CA Issuer's layout).
CA_SECRET_KEYS = {
    "tls.crt": "ca.crt",
    "tls.key": "ca.key",
    "ca.crt": "ca.crt",
    "machine-ca.crt": "machine-ca.crt",
    "machine-ca.key": "machine-ca.key",
    "deployment": "deployment",
}
CA_SECRET = "gpufleet-ca"
MACHINE_CA_SECRET = "gpufleet-machine-ca"


def part_name(who: Identity) -> str:
    return str(who).replace(":", "-")


def part_secret(who: Identity) -> str:
    """The Secret of one part's certificate, as deploy/kubernetes mounts it:
    ``gpufleet-scheduler-tls``, ``gpufleet-machine-<id>-tls``."""
    return f"gpufleet-{part_name(who)}-tls".lower().replace("_", "-")


def part_folder(root: Path, authority: Authority, who: Identity, owner: int | None) -> Path:
    folder = root / part_name(who)
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")
    reason = authority.due(who, files)
    if reason:
        authority.issue(who, files)
    if not reason and files.ca.read_bytes() != authority.ca_path.read_bytes():
        shutil.copy2(authority.ca_path, files.ca)  # the trust bundle changed (a CA rotation)
    if who.role is Role.PROVISIONER:
        for src in ("machine-ca.key", "machine-ca.crt"):  # the key first: see Authority.ensure
            if (authority.folder / src).read_bytes() != _read(folder / src):
                shutil.copy2(authority.folder / src, folder / src)
    if owner is not None:
        for path in (folder, *folder.iterdir()):
            os.chown(path, owner, owner)
    os.chmod(folder, 0o700)
    return folder


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def seed_ca(source: Path, folder: Path) -> bool:
    """Copy a CA kept elsewhere into ``folder`` when it has none; True when one was copied.
    ``source`` is the mounted ``gpufleet-ca`` Secret (:data:`CA_SECRET_KEYS`) or a CA folder
    as this tool makes it; one with no CA (the first run) leaves ``folder`` as it is."""
    if (folder / "ca.crt").exists():
        return False
    if (source / "tls.key").exists():
        names = CA_SECRET_KEYS
    elif (source / "ca.key").exists():
        names = {name: name for name in CA_FILES}
    else:
        return False
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for key, name in names.items():
        if (source / key).exists():
            (folder / name).write_bytes((source / key).read_bytes())
            os.chmod(folder / name, 0o600 if name.endswith(".key") else 0o644)
    return True


def secret_manifest(name: str, files: dict[str, bytes], tls: bool) -> dict[str, object]:
    """A Secret of ``files`` (key -> content); ``tls``: of type kubernetes.io/tls, as
    cert-manager writes them (so either path can take over the other's Secrets)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/part-of": "gpufleet",
                "app.kubernetes.io/component": "certificates",
            },
        },
        "type": "kubernetes.io/tls" if tls else "Opaque",
        "data": {key: base64.b64encode(data).decode("ascii") for key, data in sorted(files.items())},
    }


def write_secrets(out: Path, authority: Authority, parts: dict[Identity, Path]) -> list[Path]:
    """One manifest file per Secret in ``out`` (JSON, which ``kubectl apply`` reads as YAML)."""
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca = authority.folder
    manifests = {
        CA_SECRET: secret_manifest(
            CA_SECRET, {key: (ca / name).read_bytes() for key, name in CA_SECRET_KEYS.items()}, tls=True
        ),
        MACHINE_CA_SECRET: secret_manifest(
            MACHINE_CA_SECRET,
            {
                "tls.crt": (ca / "machine-ca.crt").read_bytes(),
                "tls.key": (ca / "machine-ca.key").read_bytes(),
                "ca.crt": authority.ca_path.read_bytes(),
            },
            tls=True,
        ),
    }
    for who, folder in parts.items():
        name = part_secret(who)
        manifests[name] = secret_manifest(
            name, {key: (folder / key).read_bytes() for key in ("tls.crt", "tls.key", "ca.crt")}, tls=True
        )
    written = []
    for name, manifest in manifests.items():
        path = out / f"{name}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(manifest, fh, indent=1)
        written.append(path)
    return written


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
    p.add_argument(
        "--ca-from", type=Path, default=None, help="a folder holding the CA to use (a mounted Secret)"
    )
    p.add_argument(
        "--kubernetes-secrets", type=Path, default=None, help="also write each part's Secret manifest here"
    )
    args = p.parse_args(argv)
    try:
        if args.ca_from is not None and seed_ca(args.ca_from, args.dir / "ca"):
            print(f"CA: from {args.ca_from}")
        authority = Authority.ensure(args.dir / "ca", args.deployment)
        parts: dict[Identity, Path] = {}
        for text in filter(None, (t.strip() for t in args.parts.split(","))):
            who = Identity.parse(text, args.deployment)
            parts[who] = part_folder(args.dir, authority, who, args.owner)
            print(f"{text}: {parts[who]}")
        if args.kubernetes_secrets is not None:
            for path in write_secrets(args.kubernetes_secrets, authority, parts):
                print(f"Secret: {path}")
    except ValueError as exc:
        print(f"gpufleet certs: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
