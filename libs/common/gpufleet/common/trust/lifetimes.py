"""How long a certificate of the deployment lives, and when it is renewed.

Every part follows its files (:mod:`gpufleet.common.trust.reload`), so a service's
certificate is short-lived: :data:`SERVICE_DAYS`, renewed in place once a third of its life
is left — by ``gpufleet up`` at each start (``Authority.ensure_part``), by cert-manager or
the certs Job on Kubernetes. A machine's certificate is handed to the
machine once, when it is created (a cloud instance's metadata), and nothing renews it on the
machine: :data:`MACHINE_DAYS`, the longest a machine is expected to run (a local machine gets
a new one at each boot). The machine CA, whose key the provisioner holds, lives
:data:`MACHINE_CA_DAYS` and is renewed like a service's; the root :data:`CA_DAYS` (renewing a
root is a rotation of every part's trust bundle, done by hand).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from cryptography import x509

from gpufleet.common.trust.identity import Role

CA_DAYS = 3650
MACHINE_CA_DAYS = 365
SERVICE_DAYS = 30
MACHINE_DAYS = 90
# Renewed once no more than this share of its life is left (cert-manager's default too):
# a part that is down for a while still finds its certificate good when it comes back.
RENEW_WHEN_LEFT = 1 / 3
# Clocks of parts disagree a little; a certificate valid "from now" must not be refused
# by a peer whose clock is a minute behind.
BACKDATE = datetime.timedelta(minutes=5)

Now = Callable[[], datetime.datetime]


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def leaf_days(role: Role) -> int:
    """How long a new certificate of ``role`` is good for."""
    return MACHINE_DAYS if role is Role.MACHINE else SERVICE_DAYS


def nearing_expiry(cert: x509.Certificate, now: datetime.datetime) -> bool:
    """No more than :data:`RENEW_WHEN_LEFT` of its life left, or already past it."""
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now <= life * RENEW_WHEN_LEFT
