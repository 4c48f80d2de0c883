"""Reader for ``spec.cluster`` (holodeck's ClusterSpec): pools, labels, high availability.

Cloud fields (region, instance types, images, volume sizes) are accepted and ignored with a
note; the pools' counts, labels and the HA endpoint are what cluster orchestration uses. HA without
an endpoint (holodeck's files: holodeck creates an AWS NLB) is accepted with a note: every node then
runs its own load balancer (``tether.controller.cluster.apiserver_lb``).
"""

from __future__ import annotations

from tether.controller.spec import checks
from tether.controller.spec.model import ClusterSpec, HighAvailability, NodePool
from tether.controller.spec.reader import Section

CLOUD = "ignored: tether adopts machines that exist"
MAX_CONTROL_PLANES = 7
# (The name and port are tether.controller.cluster.context's LOCAL_LB_*; that module imports this
# package, so they are spelled out here and a unit test keeps the two the same.)
LOCAL_LB_NOTE = (
    "none: every node runs its own load balancer in front of the control planes "
    "(tether-apiserver-lb on 127.0.0.1:7443); kubeadm's endpoint is apiserver.tether.internal:7443"
)


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep:
        return checks.check_host(value)
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return "port must be a number from 1 to 65535"
    return checks.check_host(host)


def _pool(parent: Section, name: str, default_count: int, low: int, high: int) -> NodePool:
    sec = parent.section(name)
    if sec is None:
        return NodePool(count=default_count)
    count = sec.integer("count", default_count, low=low, high=high)
    dedicated = sec.boolean("dedicated") if name == "controlPlane" else False
    labels = sec.string_map("labels", key_check=checks.check_label_key, value_check=checks.check_label_value)
    for cloud in ("instanceType", "os", "image", "rootVolumeSizeGB"):
        sec.ignore(cloud, CLOUD)
    sec.finish()
    return NodePool(count=count, dedicated=dedicated, labels=labels)


def cluster(spec: Section) -> ClusterSpec | None:
    sec = spec.section("cluster")
    if sec is None:
        return None
    sec.ignore("region", CLOUD)
    control = _pool(sec, "controlPlane", 1, 1, MAX_CONTROL_PLANES)
    workers = _pool(sec, "workers", 0, 0, 10_000)
    if control.count > 1 and control.count % 2 == 0:
        sec.problems.add(f"{sec.path_of('controlPlane')}.count", "must be odd when more than 1 (etcd quorum)")
    ha = HighAvailability()
    ha_sec = sec.section("highAvailability")
    if ha_sec is not None:
        enabled = ha_sec.boolean("enabled")
        endpoint = ha_sec.string("endpoint", check=_host_port)
        topology = ha_sec.choice("etcdTopology", ("stacked", "external"), "stacked")
        if topology == "external":
            ha_sec.problems.add(ha_sec.path_of("etcdTopology"), "external etcd is not supported")
        ha_sec.ignore(
            "loadBalancerType",
            "ignored: tether creates no cloud load balancer; it uses highAvailability.endpoint, or "
            "without one a load balancer on every node",
        )
        if enabled and control.count < 3:
            ha_sec.problems.add(ha_sec.path_of("enabled"), "high availability needs controlPlane.count >= 3")
        if enabled and not endpoint:
            ha_sec.problems.note(ha_sec.path_of("endpoint"), LOCAL_LB_NOTE)
        ha_sec.finish()
        ha = HighAvailability(enabled=enabled, endpoint=endpoint, etcd_topology="stacked")
    sec.finish()
    return ClusterSpec(control_plane=control, workers=workers, high_availability=ha)
