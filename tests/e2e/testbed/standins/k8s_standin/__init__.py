"""TEST FIXTURE ONLY: stand-ins for kubeadm/kubelet/kubectl/crictl (tether's e2e testbed; never shipped)."""

VERSION = "v1.31.4"
