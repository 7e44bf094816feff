"""One folder per benchmark: its loader for the native data format (and, as they land, its
protocol and scorer)."""
