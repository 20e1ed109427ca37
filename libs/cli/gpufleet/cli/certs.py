"""``gpufleet certs issue``: a client certificate of the deployment's CA.

    gpufleet certs issue --role backend --out DIR
    gpufleet certs issue --role machine --machine-id gpu-box-1 --out DIR

It reads the CA ``gpufleet up`` keeps in ``<state dir>/tls`` (``--ca-dir`` for another,
e.g. the ``ca`` folder ``python -m gpufleet.common.trust.issue`` made) and writes
``ca.crt``, ``tls.crt`` and ``tls.key`` into ``DIR`` — what ``GPUFLEET_TLS_CA_FILE``,
``GPUFLEET_TLS_CERT_FILE`` and ``GPUFLEET_TLS_KEY_FILE`` name. A machine's certificate
is signed by the machine CA and is what a self-administered box registers with.

A service's certificate lasts 30 days and a machine's 90 by default (``--days``;
gpufleet.common.trust.pki says why): every gpufleet part takes new files without a restart,
so renewing is issuing again into the same folder (a cron job, the Kubernetes certs Job).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cryptography import x509

from gpufleet.cli.credentials import DEFAULT_STATE_DIR, tls_dir
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.lifetimes import MACHINE_DAYS, SERVICE_DAYS
from gpufleet.common.trust.pki import Authority, TlsFiles


def issue(args: argparse.Namespace) -> int:
    folder = Path(args.ca_dir) if args.ca_dir else tls_dir(args.state_dir)
    try:
        authority = Authority.open(folder)
    except FileNotFoundError:
        print(
            f"gpufleet certs: no CA in {folder}: start `gpufleet up --state-dir {args.state_dir}` once, "
            "or pass --ca-dir",
            file=sys.stderr,
        )
        return 2
    role = Role(args.role)
    if (role is Role.MACHINE) != bool(args.machine_id):
        print("gpufleet certs: --machine-id goes with --role machine, and only with it", file=sys.stderr)
        return 2
    try:
        identity = Identity(role, authority.deployment, args.machine_id or None)
    except ValueError as exc:
        print(f"gpufleet certs: --machine-id: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = TlsFiles(out / "ca.crt", out / "tls.crt", out / "tls.key")
    authority.issue(identity, files, days=args.days)
    until = x509.load_pem_x509_certificate(files.cert.read_bytes()).not_valid_after_utc
    print(
        f"issued {identity} of deployment {authority.deployment}, "
        f"valid until {until:%Y-%m-%d %H:%M} UTC, into {out}:"
    )
    for name, path in (("CA", files.ca), ("CERT", files.cert), ("KEY", files.key)):
        print(f"  GPUFLEET_TLS_{name}_FILE={path}")
    return 0


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if days < 1:
        raise argparse.ArgumentTypeError(f"at least 1 day: {text!r}")
    return days


def add_parsers(sub: Any) -> None:
    certs = sub.add_parser("certs", help="certificates of the deployment's CA")
    inner = certs.add_subparsers(dest="certs_command", required=True)
    p = inner.add_parser("issue", help="write a client certificate (backend, operator, a registered machine)")
    p.add_argument("--role", required=True, choices=[r.value for r in Role])
    p.add_argument("--machine-id", default="", help="with --role machine: the box's machine id")
    p.add_argument("--out", required=True, help="folder for ca.crt, tls.crt and tls.key")
    p.add_argument(
        "--state-dir", default=DEFAULT_STATE_DIR, help="the `gpufleet up` state dir (default ./var)"
    )
    p.add_argument("--ca-dir", default=None, help="the CA folder, when it is not <state dir>/tls")
    p.add_argument(
        "--days",
        type=_days,
        default=None,
        help=f"validity in days (default {SERVICE_DAYS}; a machine's {MACHINE_DAYS})",
    )
    p.set_defaults(func=issue)
