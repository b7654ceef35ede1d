"""Side-by-side measurements against the tools users would pick instead (run with `make bench`)."""
