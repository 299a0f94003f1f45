"""What every stack shares."""

from __future__ import annotations

from cdktn import LocalBackend, TerraformStack


def local_state(stack: TerraformStack, name: str) -> None:
    """Terraform state at the repository's root, ``terraform.<environment>.tfstate``, found
    the same from ``cdktn deploy`` and ``terraform -chdir=cdktf.out/stacks/<environment>``
    (both run in that folder), and written relative so the synthesised JSON does not
    depend on where the checkout lies. Swap in a remote backend for a team (docs/deploy.md)."""
    LocalBackend(stack, path=f"../../../terraform.{name}.tfstate")


def covers(scope: str, account: str) -> bool:
    """Whether a policy budget's ``scope`` covers this account or subscription: ``*``,
    the id itself, or a scope under it (``<id>/<region or workspace>``)."""
    return scope in ("*", account) or scope.startswith(f"{account}/")
