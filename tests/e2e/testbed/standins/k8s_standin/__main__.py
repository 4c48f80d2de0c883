"""Dispatch on the name the zipapp runs as: kubeadm, kubelet, kubectl, crictl, kube-apiserver-standin, ..."""

import importlib
import os
import sys

TOOLS = {
    "kubeadm": "kubeadm",
    "kubelet": "kubelet",
    "kubectl": "kubectl",
    "crictl": "crictl",
    "kube-apiserver-standin": "apiserver",
    "kubeadm-standin": "hooks",
}


def main() -> int:
    tool = os.environ.get("K8S_STANDIN_TOOL") or os.path.basename(sys.argv[0])
    if tool.endswith(".pyz"):  # `python3 k8s-standin.pyz TOOL ARGS...`
        tool = sys.argv.pop(1) if len(sys.argv) > 1 else ""
    if tool not in TOOLS:
        print(f"k8s-standin: unknown tool {tool!r} (one of {', '.join(TOOLS)})", file=sys.stderr)
        return 2
    module = importlib.import_module(f"k8s_standin.{TOOLS[tool]}")
    return int(module.main(sys.argv[1:]) or 0)


def run() -> None:
    """zipapp entry point (zipapp ignores a return value)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
