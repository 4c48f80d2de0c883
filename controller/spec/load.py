"""Parse an Environment document and validate all of it, collecting every problem with its path."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from tether.controller.errors import InvalidArgument, Problem
from tether.controller.spec import (
    bounded_yaml,
    names,
    parse_cluster,
    parse_components,
    parse_custom,
    parse_hardware,
    parse_kubernetes,
    parse_rollout,
    parse_sources,
)
from tether.controller.spec.model import EnvironmentSpec
from tether.controller.spec.reader import Problems, Section

HOLODECK_API = "holodeck.nvidia.com/v1alpha1"
TETHER_API = "tether.dev/v1alpha1"
API_VERSIONS = (HOLODECK_API, TETHER_API)
NAME_RE = names.DNS_LABEL_RE  # tether's apiVersion; holodeck's: names.HOLODECK_NAME_RE
# tether's own sections: no holodeck file has them, so an unknown field there is a typo even
# under holodeck's apiVersion (where unknown fields are otherwise notes).
TETHER_EXTENSIONS = ("spec.rollout", "spec.hardware", "spec.packageRepositories")


class SpecError(InvalidArgument):
    """The document is invalid; ``problems`` holds one ``path: message`` line per problem
    (``violations``: each with its path apart)."""

    def __init__(self, problems: Sequence[str | Problem]) -> None:
        super().__init__(f"invalid environment ({len(problems)} problems)", problems)


@dataclass(frozen=True)
class LoadedSpec:
    """A valid document: the typed spec, its apiVersion, a JSON-ready normalized form, and notes."""

    spec: EnvironmentSpec
    api_version: str
    normalized: Mapping[str, Any]
    notes: tuple[str, ...] = field(default=())


def load_document(text: str) -> LoadedSpec:
    """Parse and validate; raises ``SpecError`` with every problem found.

    ``text`` may be a stream of several YAML documents (``---``) when exactly one of them is
    an Environment: that one is read, and a note names it and the others."""
    try:
        docs = bounded_yaml.load_all(text)  # the limits hold for the whole stream
    except bounded_yaml.YamlLimit as exc:
        raise SpecError([Problem("document", str(exc))]) from None
    except yaml.YAMLError as exc:
        raise SpecError([Problem("document", f"not valid YAML: {exc}")]) from None
    doc, stream_note = pick_environment(docs)
    if not isinstance(doc, dict):
        raise SpecError([Problem("document", "expected a mapping with apiVersion, kind, metadata and spec")])
    problems = Problems()
    if stream_note:
        problems.note("document", stream_note)
    top = Section(doc, "", problems)
    api_version = top.raw("apiVersion")
    if api_version not in API_VERSIONS:
        problems.add("apiVersion", f"must be one of {', '.join(API_VERSIONS)} (got {api_version!r})")
    if api_version == HOLODECK_API:
        problems.holodeck = True  # holodeck's leniencies, each with a note
        problems.strict_under = TETHER_EXTENSIONS
    kind = top.raw("kind")
    if kind != "Environment":
        problems.add("kind", f"must be Environment (got {kind!r})")
    name = _name(top)
    top.ignore("status", "ignored: status is reported by the nodes")
    spec_sec = top.section("spec") or Section({}, "spec", problems)
    top.finish()
    spec = _spec(spec_sec, name)
    _cross_checks(spec, problems)
    if problems.items:
        raise SpecError(problems.items)
    return LoadedSpec(
        spec=spec,
        api_version=str(api_version),
        normalized=normalize(spec),
        notes=tuple(problems.notes),
    )


def _name(top: Section) -> str:
    meta = top.section("metadata")
    name = meta.raw("name") if meta is not None else None
    holodeck = top.problems.holodeck
    rule, rule_text = (
        (names.HOLODECK_NAME_RE, names.HOLODECK_NAME_RULE) if holodeck else (NAME_RE, names.DNS_LABEL_RULE)
    )
    if not isinstance(name, str) or not rule.fullmatch(name):
        top.problems.add("metadata.name", f"required: {rule_text}")
        name = "invalid"
    elif names.dns_name(name) != name:
        top.problems.note(
            "metadata.name",
            f"{name!r} is {names.dns_name(name)!r} where a DNS name is needed "
            "(kubeadm's cluster name, the kubeconfig's cluster and context)",
        )
    if meta is not None:
        meta.ignore_rest("ignored")
    return name


def _kind_of(doc: Any) -> str:
    if not isinstance(doc, Mapping):
        return "not a mapping"
    kind = next((v for k, v in doc.items() if str(k).lower() == "kind"), None)
    return f"kind {kind}" if isinstance(kind, str) and kind else "no kind"


def is_environment(doc: Any) -> bool:
    """``kind: Environment`` (the key in any case, as the reader matches keys)."""
    return _kind_of(doc) == "kind Environment"


STORED_WITH_IT = (
    "WARNING: the other documents are stored with the Environment and shown by "
    "`tetherctl env get -o yaml`: keep no credentials in them"
)


def pick_environment(docs: Sequence[Any]) -> tuple[Any, str]:
    """(the Environment document of a YAML stream, a note naming it among the others, or "").

    One document (empty ones aside) is returned as it is, whatever it holds. Several: exactly
    one must be an Environment; none or more than one is a ``SpecError`` naming the documents
    by their place in the stream (1 is the first) and kind."""
    present = [(i, d) for i, d in enumerate(docs, 1) if d is not None]
    if len(present) <= 1:
        return (present[0][1] if present else None), ""
    envs = [(i, d) for i, d in present if is_environment(d)]
    listed = ", ".join(f"document {i} ({_kind_of(d)})" for i, d in present)
    if not envs:
        raise SpecError(
            [
                Problem(
                    "document",
                    f"the file holds {len(present)} documents and none is an Environment: {listed}",
                )
            ]
        )
    if len(envs) > 1:
        which = ", ".join(str(i) for i, _ in envs)
        raise SpecError(
            [
                Problem(
                    "document",
                    f"the file holds {len(present)} documents and {len(envs)} are Environments "
                    f"(documents {which}): give one Environment per file",
                )
            ]
        )
    index, doc = envs[0]
    others = ", ".join(f"document {i} ({_kind_of(d)})" for i, d in present if i != index)
    return (
        doc,
        f"the file holds {len(present)} documents; document {index} is the Environment, ignored: "
        f"{others} ({STORED_WITH_IT})",
    )


def _spec(sec: Section, name: str) -> EnvironmentSpec:
    parse_sources.provider_fields(sec)
    spec = EnvironmentSpec(
        name=name,
        kernel=parse_components.kernel(sec),
        driver=parse_components.driver(sec),
        runtime=parse_components.runtime(sec),
        toolkit=parse_components.toolkit(sec),
        kubernetes=parse_kubernetes.kubernetes(sec),
        custom_templates=parse_custom.custom_templates(sec),
        cluster=parse_cluster.cluster(sec),
        package_repositories=parse_sources.package_repositories(sec),
        download_mirror=parse_sources.download_mirror(sec),
        rollout=parse_rollout.rollout(sec),
        hardware=parse_hardware.hardware(sec),
    )
    sec.finish()
    return spec


def _cross_checks(spec: EnvironmentSpec, problems: Problems) -> None:
    """Rules that span sections: holodeck's late failures, caught before anything runs."""
    k8s = spec.kubernetes
    if k8s.install and k8s.installer == "microk8s":
        if k8s.source != "release":
            problems.add("spec.kubernetes.source", "microk8s installs from the snap store: only release")
        if spec.runtime.install:
            problems.add(
                "spec.containerRuntime.install",
                "microk8s brings its own containerd: turn the container runtime off",
            )
        if spec.toolkit.install:
            problems.add(
                "spec.nvidiaContainerToolkit.install",
                "microk8s's gpu add-on installs the toolkit into its containerd: turn this off",
            )
    if k8s.install and k8s.installer == "kind" and spec.runtime.install and spec.runtime.name != "docker":
        problems.add("spec.containerRuntime.name", "kind runs its nodes in docker: use docker")
    if k8s.installer != "kubeadm" and k8s.feature_gates:
        problems.add("spec.kubernetes.K8sFeatureGates", "only used with the kubeadm installer")
    if k8s.installer != "kubeadm" and k8s.kubeadm_config:
        problems.add("spec.kubernetes.kubeAdmConfig", "only used with the kubeadm installer")
    if k8s.installer != "kind" and k8s.kind_config:
        problems.add("spec.kubernetes.kindConfig", "only used with the kind installer")
    if spec.hardware is not None and spec.hardware.on_drift == "cordon" and spec.cluster is None:
        problems.add("spec.hardware.onDrift", "cordon needs a kubeadm cluster (spec.cluster)")
    if spec.cluster is not None and not (k8s.install and k8s.installer == "kubeadm"):
        problems.add("spec.cluster", "a cluster needs kubernetes.install: true with the kubeadm installer")


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def normalize(spec: EnvironmentSpec) -> dict[str, Any]:
    """The resolved spec as plain JSON data (tether's apiVersion, defaults applied)."""
    return {
        "apiVersion": TETHER_API,
        "kind": "Environment",
        "metadata": {"name": spec.name},
        "spec": _plain(dataclasses.asdict(spec)),
    }
