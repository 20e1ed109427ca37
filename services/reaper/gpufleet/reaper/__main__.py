"""``python -m gpufleet.reaper``: see :mod:`gpufleet.reaper.main`."""

from gpufleet.reaper.main import main

raise SystemExit(main())
