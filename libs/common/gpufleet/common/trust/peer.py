"""The identity a call's peer proved, read from its verified certificate.

The TLS layer has already checked the chain up to the deployment's root; what is left
is to read the URI SAN and to check that the right key signed it: a machine identity
only from the machine CA, every other role only from the root (see
:mod:`gpufleet.common.trust.pki`). Parsing is cached by certificate, so a busy API pays
for it once per client, not once per call.
"""

from __future__ import annotations

import threading
from typing import Any

from cryptography import x509

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import machine_ca_subject, root_subject

_CACHE_MAX = 4096
_cache: dict[bytes, Identity | None] = {}
_lock = threading.Lock()


def certificate_pem(auth: Any) -> bytes | None:
    """The peer's verified certificate (PEM) from a call's auth context, or None."""
    values = auth.get("x509_pem_cert") if auth else None
    return values[0] if values else None


def _from_certificate(pem: bytes) -> Identity | None:
    try:
        cert = x509.load_pem_x509_certificate(pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    identities = [i for i in (Identity.parse_uri(u) for u in uris) if i is not None]
    if len(identities) != 1:  # none, or a certificate that would be two parts at once
        return None
    identity = identities[0]
    expected = (
        machine_ca_subject(identity.deployment)
        if identity.role is Role.MACHINE
        else root_subject(identity.deployment)
    )
    return identity if cert.issuer == expected else None


def identity_from_auth_context(auth: Any) -> Identity | None:
    """The verified identity, or None: no certificate, or one naming no identity of ours,
    or one signed by the wrong one of our two keys."""
    pem = certificate_pem(auth)
    if pem is None:
        return None
    with _lock:
        if pem in _cache:
            return _cache[pem]
    identity = _from_certificate(pem)
    with _lock:
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[pem] = identity
    return identity


def identity_of(context: Any) -> Identity | None:
    """The identity of the peer of a servicer's call (either kind of server)."""
    return identity_from_auth_context(context.auth_context())
