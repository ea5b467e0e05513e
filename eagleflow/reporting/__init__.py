"""What a person reads of a run: the report (`report`: report.json, the terminal and markdown tables) and its
pictures (`plots`, drawn on the host)."""
