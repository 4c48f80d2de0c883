"""tetherctl: the admin command line (a thin client of the admin gRPC API)."""
