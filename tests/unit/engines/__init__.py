"""The serving engines' pure parts (eagleflow.engines): command lines, metrics and acceptance parsers,
the launch watchdog on a real engine log, the chat client's answer parsing. No engine is started."""
