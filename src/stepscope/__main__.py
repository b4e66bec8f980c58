from stepscope.cli import main

main()
