"""A Compute Engine REST fake of the project's own, for the gcp driver's tests.

No usable Compute Engine emulator exists, so this small HTTP server on 127.0.0.1 answers
the v1 REST calls google-cloud-compute's REST transport makes — instances insert, get,
start, stop, resume, delete, aggregatedList (filter, paging), zoneOperations get and wait —
with GCE's own JSON shapes (see shapes.py), and can be scripted to fail the way GCE fails:
a stockout as an operation error, quota as an operation error or a 403, refused
credentials, 404s, 429s and 5xx, operations that never finish, answers that get lost.

    with GceFake(latencies=Latencies(insert=0.1)) as fake:
        clients = GcpClients.connect(fake.endpoint, AnonymousCredentials())
        fake.set_stockout("us-central1-a")
"""

from tests.support.gce_fake.model import MACHINE_TYPES, Latencies
from tests.support.gce_fake.server import GceFake, RecordedRequest, running

__all__ = ["MACHINE_TYPES", "GceFake", "Latencies", "RecordedRequest", "running"]
