"""Test doubles at the seams that talk to real protocols: an OpenSSH server, an SSM endpoint."""
