"""The `run` and `list` commands (bench, report and check live next to what they drive)."""
