from gpufleet.scheduler.main import main

raise SystemExit(main())
