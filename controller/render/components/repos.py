"""``spec.packageRepositories``: the apt or dnf repositories that replace the upstream ones."""

from __future__ import annotations

from tether.controller.render.shell import Trusted, q
from tether.controller.render.steps import RenderInput, make_step
from tether.nodeagent.model import Step


def steps(inp: RenderInput) -> list[Step]:
    repos = inp.spec.package_repositories.for_manager(inp.target.pm)
    if not repos:
        return []
    env: dict[str, str] = {}
    entries = []
    for i, repo in enumerate(repos):
        name = f"tether-{i}"
        key_env = ""
        if repo.key and not repo.key.startswith("https://"):
            key_env = f"TETHER_REPO_KEY_{i}"
            env[key_env] = repo.key
        entries.append(
            {
                "name": q(name),
                "url": q(repo.url),
                "key_url": q(repo.key) if repo.key.startswith("https://") else "",
                "key_env": Trusted(key_env),
                "trusted": repo.trusted,
                "suite": q(repo.suite),
                "components": q(" ".join(repo.components)),
                "keyfile": q(
                    f"/etc/apt/keyrings/{name}.asc"
                    if inp.target.pm == "apt"
                    else f"/etc/pki/rpm-gpg/{name}.asc"
                ),
            }
        )
    return [
        make_step(
            inp,
            name="package-repositories",
            component="repositories",
            phase="pre-install",
            template="repos.j2",
            timeout=900,
            requested={"repositories": " ".join(r.url for r in repos)},
            description="configures the spec's package repositories in place of the upstream ones",
            env=env,
            context={"repos": entries},
        )
    ]
