from gpufleet.scheduler.main import main

main()
