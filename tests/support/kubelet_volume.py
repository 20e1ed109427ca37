"""A folder of files written the way a kubelet projects a Secret into a pod.

The kubelet never rewrites a file in place: it writes every key of the new Secret into a
new timestamped folder, points a temporary ``..data_tmp`` symlink at it and renames that
over ``..data`` (one atomic step), and each file the pod sees is a symlink through
``..data`` (``tls.crt -> ..data/tls.crt``). Then the old folder goes. A process that
follows its files must see the change through the symlinks, whatever it cached.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from pathlib import Path

from gpufleet.common.trust.pki import TlsFiles

DATA = "..data"


class KubeletVolume:
    """A Secret volume mounted at ``folder``, holding ``ca.crt``, ``tls.crt``, ``tls.key``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def files(self) -> TlsFiles:
        return TlsFiles(self.folder / "ca.crt", self.folder / "tls.crt", self.folder / "tls.key")

    def publish(self, contents: dict[str, bytes]) -> None:
        """Every key's new content, swapped in at once."""
        stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
        new = Path(tempfile.mkdtemp(prefix=stamp, dir=self.folder))
        for name, data in contents.items():
            (new / name).write_bytes(data)
            (new / name).chmod(0o600 if name.endswith(".key") else 0o644)
        new.chmod(0o755)
        data_link = self.folder / DATA
        old = data_link.resolve() if data_link.is_symlink() else None
        tmp = self.folder / "..data_tmp"
        tmp.unlink(missing_ok=True)
        os.symlink(new.name, tmp)
        os.rename(tmp, data_link)
        for name in contents:
            visible = self.folder / name
            if not visible.is_symlink():
                os.symlink(f"{DATA}/{name}", visible)
        if old is not None and old != new:
            shutil.rmtree(old)

    def publish_files(self, source: TlsFiles) -> None:
        """The content of another part's files (e.g. what an authority just issued)."""
        ca, cert, key = source.read()
        self.publish({"ca.crt": ca, "tls.crt": cert, "tls.key": key})
