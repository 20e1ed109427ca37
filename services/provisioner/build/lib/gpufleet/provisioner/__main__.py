from gpufleet.provisioner.main import main

main()
