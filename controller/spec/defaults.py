"""Built-in defaults (holodeck's, §1.10 of the inventory, where they still make sense)."""

from __future__ import annotations

DRIVER_BRANCH = "580"
DRIVER_GIT_REPO = "https://github.com/NVIDIA/open-gpu-kernel-modules.git"
CONTAINERD_VERSION = "1.7.27"
CRIO_VERSION = "v1.33"
CRI_DOCKERD_VERSION = "0.3.17"
KUBERNETES_VERSION = "v1.35.3"
CNI_PLUGINS_VERSION = "v1.9.1"
CRICTL_VERSION = "v1.35.0"
CALICO_VERSION = "v3.31.5"
KIND_VERSION = "v0.29.0"
RUNC_VERSION = "v1.2.3"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
POD_SUBNET = "192.168.0.0/16"
LATEST_TRACK = "main"

GIT_REPOS = {
    "containerd": "https://github.com/containerd/containerd.git",
    "docker": "https://github.com/moby/moby.git",
    "crio": "https://github.com/cri-o/cri-o.git",
    "toolkit": "https://github.com/NVIDIA/nvidia-container-toolkit.git",
    "kubernetes": "https://github.com/kubernetes/kubernetes.git",
}
LATEST_TRACKS = {"kubernetes": "master"}
