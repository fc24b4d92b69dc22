"""``mcruntime rbac TARGET``: print the RBAC the target's manager needs, as YAML for ``kubectl apply``.

The manager is built exactly as ``mcruntime run`` builds it (same target, same
settings flags, so leader election or sharding set by a flag is reflected in
the leases granted) but never started: nothing connects anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from .._base.names import name_problem
from .._base.permissions import Role
from .._manager.settings import ManagerSettings, misspelled_variables
from .._rbac.rbac import rbac_for
from .check import ignored_flags
from .commands import Command
from .common import add_target_arguments, load_manager, prepare
from .errors import ExitCode, UsageError

DESCRIPTION = """\
Build the target's Manager (never started) and print, as multi-document YAML,
the ClusterRoles, Roles and bindings it needs: the hub role (the cluster the
manager runs in) bound to --service-account in --namespace, and the member role
(every provider cluster) bound to a ServiceAccount of the same name and namespace
there. Derived from the controllers' wiring, their declared writes, leader
election or sharding, the provider's own reads and the webhook registration."""


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--name", required=True, help="names the roles and bindings (<name>-hub, <name>-member)"
    )
    parser.add_argument(
        "--namespace", required=True, help="the namespace of the operator's ServiceAccount (and of its Roles)"
    )
    parser.add_argument("--service-account", default=None, help="the ServiceAccount bound (default: --name)")
    parser.add_argument(
        "--role",
        choices=("hub", "member", "all"),
        default="all",
        help="print only the hub's or the members' objects (default: both)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print each permission and why it is needed instead of the YAML",
    )


def execute(arguments: argparse.Namespace) -> int:
    settings, flags = prepare(arguments)
    return asyncio.run(_render(arguments, settings, flags))


async def _render(
    arguments: argparse.Namespace, settings: ManagerSettings, flags: dict[str, object]
) -> ExitCode:
    manager = await load_manager(arguments, settings)
    # RBAC generated for a manager the flags never reached would lack what they ask for
    # (a --leader-election without its Lease rules): refuse, as run --check does.
    ignored = [found for found in (ignored_flags(manager, flags, settings),) if found is not None]
    misspelled = misspelled_variables(os.environ)  # a setting never read: its rules would be missing
    if ignored or misspelled:
        raise UsageError("; ".join([*ignored, *misspelled]))
    account = arguments.name if arguments.service_account is None else arguments.service_account
    for flag, value, subdomain in (
        ("--name", arguments.name, True),
        ("--namespace", arguments.namespace, False),
        ("--service-account", account, True),
    ):
        problem = name_problem(value, subdomain=subdomain)
        if problem is not None:
            raise UsageError(f"{flag} {value!r} {problem}")
    try:
        rbac = rbac_for(
            manager,
            name=arguments.name,
            namespace=arguments.namespace,
            service_account=arguments.service_account,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    role: Role | None = None if arguments.role == "all" else arguments.role
    if arguments.explain:
        sys.stdout.write(rbac.explain(role))
        return ExitCode.OK
    sys.stdout.write(rbac.to_yaml(role))
    return ExitCode.OK


COMMAND = Command(
    name="rbac",
    help="print the RBAC (hub and member roles) the manager needs, as YAML",
    configure=configure,
    execute=execute,
    description=DESCRIPTION,
)
