"""Generated protobuf package for tether.v1 (never edit by hand: python scripts/gen_protos.py)."""
