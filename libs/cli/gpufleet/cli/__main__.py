from gpufleet.cli.main import main

main()
