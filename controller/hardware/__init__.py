"""spec.hardware: the hardware gate (quarantine before steps and before the join), GPU drift."""
