"""``tetherctl bootstrap``: adopt machines over SSH or SSM, exactly once.

Each machine goes connect -> detect -> prereqs -> agent -> verify -> done, with a live line per
machine and a summary row each; the exit status is non-zero when any machine failed. A second
run against an installed machine changes nothing. Secrets never go on the command line.
"""

from __future__ import annotations

import argparse
from typing import Any

from tether.controller.cli.output import plain

DEFAULT_CONCURRENCY = 8

EXAMPLES = """\
examples:
  tetherctl bootstrap --env lab --role worker --ssh root@10.0.0.5 --identity ~/.ssh/id_ed25519 \\
      --host-key 'ssh-ed25519 AAAA...' --controller 10.0.0.1:7443
  TETHER_SSH_PASSWORD=... tetherctl bootstrap --env lab --ssh admin@10.0.0.6:2222 \\
      --password-env TETHER_SSH_PASSWORD --known-hosts ./known_hosts
  tetherctl bootstrap --env lab --ssm i-0123456789abcdef0 --region us-east-1 --bundle-s3 s3://b/tether
  tetherctl bootstrap --inventory nodes.yaml --concurrency 8
  tetherctl bootstrap --inventory env.yaml --known-hosts ./known_hosts   # holodeck auth.sshConfig
"""


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "bootstrap",
        help="adopt machines over SSH or SSM: install the agent as a systemd service, exactly once",
        description=plain(__doc__ or ""),
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--ssh", metavar="USER@HOST[:PORT]", help="a machine reachable over SSH")
    where.add_argument("--ssm", metavar="INSTANCE_ID", help="an EC2 instance reachable through AWS SSM")
    where.add_argument("--inventory", metavar="FILE", help="many machines (inventory or Environment YAML)")
    b.add_argument("--env", dest="environment", default="", help="environment the nodes join")
    b.add_argument("--role", default="", help="control-plane or worker (default worker)")
    b.add_argument("--node-name", default="", help="node name (default: the machine's hostname)")
    auth = b.add_argument_group("SSH login (secrets never on the command line)")
    auth.add_argument("--identity", metavar="KEYFILE", default="", help="private key file")
    auth.add_argument(
        "--passphrase-env", metavar="VAR", default="", help="variable holding the key passphrase"
    )
    auth.add_argument("--password-env", metavar="VAR", default="", help="variable holding the SSH password")
    auth.add_argument("--ask-password", action="store_true", help="prompt for the SSH password")
    auth.add_argument("--ssh-agent", action="store_true", help="use the ssh-agent at $SSH_AUTH_SOCK")
    auth.add_argument(
        "--jump", metavar="USER@HOST[:PORT]", default="", help="jump host / bastion (same credentials)"
    )
    _host_key_args(b.add_argument_group("SSH host keys (verified by default)"))
    aws = b.add_argument_group("AWS SSM")
    aws.add_argument("--region", default="", help="AWS region of --ssm instances")
    aws.add_argument("--ssm-endpoint", default="", help="SSM endpoint URL (VPC endpoints, tests)")
    aws.add_argument("--aws-profile", default="", help="AWS profile")
    bundle = b.add_argument_group("agent bundle (built here from wheels; the node needs no internet)")
    bundle.add_argument(
        "--bundle-s3", metavar="s3://BUCKET/PREFIX", default="", help="SSM nodes fetch it here"
    )
    bundle.add_argument("--s3-endpoint", default="", help="S3 endpoint URL (VPC endpoints, tests)")
    bundle.add_argument(
        "--serve-bundle", metavar="HOST[:PORT]", default="", help="serve it to SSM nodes from this machine"
    )
    bundle.add_argument("--wheel-dir", default="", help="take wheels from this directory (offline)")
    bundle.add_argument("--bundle-cache", default="", help="bundle cache (default ~/.cache/tether/bundles)")
    b.add_argument(
        "--controller",
        default="",
        help="HOST:PORT the nodes dial, or several replicas: A,B (default: admin.conf's)",
    )
    b.add_argument(
        "--via-controller", action="store_true", help="let the controller do it (AdminService.Bootstrap)"
    )
    b.add_argument("--force", action="store_true", help="reinstall bundle, unit and config; identity kept")
    b.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="machines at a time")
    b.add_argument("--verify-timeout", type=float, default=180.0, help="seconds to wait for enrollment")
    b.add_argument("-o", "--output", choices=("text", "json"), default="text", help="json: results on stdout")
    b.set_defaults(func=command)


def _host_key_args(keys: Any) -> None:
    keys.add_argument("--known-hosts", metavar="FILE", default="", help="known_hosts file to verify against")
    keys.add_argument(
        "--host-key", metavar="'TYPE BASE64'", default="", help="the one key the host must present"
    )
    keys.add_argument(
        "--accept-new-host-key", action="store_true", help="trust an unknown host's key once and record it"
    )
    keys.add_argument(
        "--insecure-ignore-host-key",
        action="store_true",
        help="verify no host key at all (also required for an inventory's knownHostsPolicy: off)",
    )


def command(args: argparse.Namespace) -> int:
    from tether.controller.cli import bootstrap_run  # asyncssh, boto3, cryptography: only when used

    return bootstrap_run.main(args)
