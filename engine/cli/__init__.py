"""`tramontane-cli`: one parser (main.py) and a module per group of subcommands."""
