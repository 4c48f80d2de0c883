"""Real-node testbed: systemd-nspawn nodes with OpenSSH on a private bridge, a local package repo."""
