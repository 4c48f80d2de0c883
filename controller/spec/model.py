"""The typed Environment spec: what ``load_document`` returns and ``render`` consumes.

One model for both apiVersions (holodeck's ``holodeck.nvidia.com/v1alpha1`` and tether's
``tether.dev/v1alpha1``). Legacy aliases are folded in by the loader, defaults are applied there
too, so everything here is the resolved, validated value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tether.controller.spec.names import dns_name

PHASES = ("pre-install", "post-runtime", "post-toolkit", "post-kubernetes", "post-install")
ROLES = ("control-plane", "worker")
RUNTIMES = ("containerd", "docker", "crio")
INSTALLERS = ("kubeadm", "kind", "microk8s")


@dataclass(frozen=True)
class GitSource:
    """Build from a repository at a ref (tag, branch, full SHA or ``refs/pull/N/head``)."""

    repo: str
    ref: str


@dataclass(frozen=True)
class KernelSpec:
    version: str


@dataclass(frozen=True)
class DriverSpec:
    install: bool = False
    source: str = "package"  # package | runfile | git
    branch: str = ""  # package: driver branch, e.g. 580 (default when no version is given)
    version: str = ""  # package: exact version, checked strictly after install
    runfile_url: str = ""
    runfile_sha256: str = ""
    git: GitSource | None = None


@dataclass(frozen=True)
class RuntimeSpec:
    install: bool = False
    name: str = "containerd"
    source: str = "package"  # package | git | latest
    version: str = ""  # package pin; "" means the repository's newest
    package_name: str = ""  # override of the distribution package name (mirrors that rename it)
    git: GitSource | None = None  # for git and latest (latest: ref is the track branch)
    # smokeTest (Docker only): `docker run --rm <image>` after the install, as holodeck always does
    smoke_test: bool = False
    smoke_test_image: str = ""  # "" = hello-world


@dataclass(frozen=True)
class ToolkitSpec:
    install: bool = False
    source: str = "package"  # package | git | latest
    channel: str = "stable"
    version: str = ""
    git: GitSource | None = None
    enable_cdi: bool = False


@dataclass(frozen=True)
class KubernetesSpec:
    install: bool = False
    installer: str = "kubeadm"
    source: str = "release"  # release | git | latest
    version: str = ""  # vX.Y.Z for release (and the kind node image)
    git: GitSource | None = None
    feature_gates: tuple[str, ...] = ()
    arch: str = ""
    cni_plugins_version: str = ""  # "" = the default (binaries) or the repository's (packages)
    crictl_version: str = ""
    calico_version: str = ""
    kind_version: str = ""
    endpoint_host: str = ""
    kubeadm_config: str = ""  # the user's kubeadm config, inlined
    kind_config: str = ""  # the user's kind config, inlined
    # remoteAccess: the API server certificate names every address and name of the init node (and
    # K8sEndpointHost), and the exported kubeconfig points at K8sEndpointHost when one is given.
    remote_access: bool = False
    kube_config: str = ""  # kubeConfig: where `tetherctl cluster kubeconfig` writes it (operator's cwd)


@dataclass(frozen=True)
class CustomTemplate:
    name: str
    phase: str = "post-install"
    inline: str = ""  # script text (inline or a file inlined by tetherctl)
    url: str = ""  # fetched by the node through the download mirror
    sha256: str = ""  # required for url; checked for inline text when given
    env: Mapping[str, str] = field(default_factory=dict)
    continue_on_error: bool = False
    timeout_seconds: int = 600
    roles: tuple[str, ...] = ROLES


@dataclass(frozen=True)
class NodePool:
    count: int = 1
    dedicated: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HighAvailability:
    enabled: bool = False
    endpoint: str = ""  # host or host:port of the load balancer in front of the API servers
    etcd_topology: str = "stacked"


@dataclass(frozen=True)
class ClusterSpec:
    """holodeck's ClusterSpec. Parsed and validated here; orchestrated by the cluster module."""

    control_plane: NodePool = field(default_factory=NodePool)
    workers: NodePool = field(default_factory=lambda: NodePool(count=0))
    high_availability: HighAvailability = field(default_factory=HighAvailability)


@dataclass(frozen=True)
class PackageRepository:
    """One apt or dnf repository that replaces the upstream ones (air-gapped sites)."""

    url: str
    key: str = ""  # https URL of the signing key, or an ASCII-armored key
    trusted: bool = False  # no signature check: only when the spec says so
    suite: str = ""  # apt: distribution ("./" for a flat repository)
    components: tuple[str, ...] = ()  # apt: e.g. ("main",)


@dataclass(frozen=True)
class PackageRepositories:
    apt: tuple[PackageRepository, ...] = ()
    dnf: tuple[PackageRepository, ...] = ()

    def for_manager(self, manager: str) -> tuple[PackageRepository, ...]:
        return self.apt if manager == "apt" else self.dnf


@dataclass(frozen=True)
class RolloutPolicy:
    """How a new generation moves through the nodes (tether's extension, ``spec.rollout``).

    ``max_parallel`` and ``max_failures`` are a count ("2") or a share of the nodes ("25%");
    ``resolve_count`` turns them into a number for a fleet of a given size.
    """

    max_parallel: str = ""  # "" = every node at once
    max_failures: str = "0"
    canary: int = 0
    min_healthy_seconds: int = 0
    drain: bool = False


@dataclass(frozen=True)
class GpuExpectation:
    """The NVIDIA GPUs a node must have (``spec.hardware.gpus``)."""

    count: int  # exactly this many
    product: str = ""  # a substring of the product name (PCI name before a driver, nvidia-smi after)
    memory_mib: int = 0  # at least, per GPU (checked once a driver is there); 0: not checked
    driver_version: str = ""  # a prefix of the driver version (checked after the driver step)
    diagnostics: str = ""  # "", "short" (dcgmi diag -r 1) or "long" (dcgmi diag -r 2)


@dataclass(frozen=True)
class HardwareSpec:
    """What a node must have before it provisions and before it joins (tether's extension,
    ``spec.hardware``); a node that does not is quarantined (``tether.controller.hardware``)."""

    gpus: GpuExpectation | None = None
    cpus_min: int = 0
    memory_gib_min: int = 0
    on_drift: str = ""  # "" (conditions and events only) or "cordon" (kubeadm nodes)


@dataclass(frozen=True)
class EnvironmentSpec:
    name: str
    kernel: KernelSpec | None = None
    driver: DriverSpec = field(default_factory=DriverSpec)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    toolkit: ToolkitSpec = field(default_factory=ToolkitSpec)
    kubernetes: KubernetesSpec = field(default_factory=KubernetesSpec)
    custom_templates: tuple[CustomTemplate, ...] = ()
    cluster: ClusterSpec | None = None
    package_repositories: PackageRepositories = field(default_factory=PackageRepositories)
    download_mirror: str = ""
    rollout: RolloutPolicy = field(default_factory=RolloutPolicy)
    hardware: HardwareSpec | None = None

    @property
    def dns_name(self) -> str:
        """``name`` where a DNS label is needed (``spec.names.dns_name``); ``name`` stays the key."""
        return dns_name(self.name)
