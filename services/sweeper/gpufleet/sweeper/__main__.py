"""``python -m gpufleet.sweeper``: see :mod:`gpufleet.sweeper.main`."""

from gpufleet.sweeper.main import main

raise SystemExit(main())
