"""gpufleet's metrics: the catalogue (:mod:`.catalog`), the one place instruments are made
from it (:mod:`.instruments`), and the generated reference (:mod:`.reference`)."""
