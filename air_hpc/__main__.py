from air_hpc.cli.main import main

main()
