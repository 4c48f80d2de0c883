"""Dispatch on the name the zipapp runs as: kubeadm, kubelet, kubectl, crictl, kube-apiserver-standin, ..."""

import os
import sys


def main() -> int:
    tool = os.environ.get("K8S_STANDIN_TOOL") or os.path.basename(sys.argv[0])
    if tool.endswith(".pyz"):  # `python3 k8s-standin.pyz TOOL ARGS...`
        tool = sys.argv.pop(1) if len(sys.argv) > 1 else ""
    if tool == "kubeadm":
        from k8s_standin import kubeadm as mod
    elif tool == "kubelet":
        from k8s_standin import kubelet as mod
    elif tool == "kubectl":
        from k8s_standin import kubectl as mod
    elif tool == "crictl":
        from k8s_standin import crictl as mod
    elif tool == "kube-apiserver-standin":
        from k8s_standin import apiserver as mod
    elif tool == "kubeadm-standin":
        from k8s_standin import hooks as mod
    else:
        print(f"k8s-standin: unknown tool {tool!r}", file=sys.stderr)
        return 2
    return int(mod.main(sys.argv[1:]) or 0)


def run() -> None:
    """zipapp entry point (zipapp ignores a return value)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
