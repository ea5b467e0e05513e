"""`eagleflow`, the operator's command line (cli.main)."""
