from sandboxctl.cli.app import main

main()
