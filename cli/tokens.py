"""``tasuki token create|list|revoke`` (issue 40): personal API tokens managed by whoever administers the host — for
a person who cannot reach the console, for a CI job, or to revoke a leaked token at once. Whoever can run this
command can read the contexts root anyway, so it acts with the admin role; each change goes to the audit log as
``cli:<unix user>``."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from cli.audit import record_cli
from cli.common import out

if TYPE_CHECKING:
    from worker.settings_models import Settings

EXIT_OK = 0


def create_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("owner", help="whose token: the person's e-mail (their tasks' user), or a job's name")
    parser.add_argument("--role", default="operator", choices=["viewer", "operator", "admin"],
                        help="what the token may do (default operator: submit and cancel)")
    parser.add_argument("--days", type=int, default=30, help="days it lives (at most auth.token_max_days)")
    parser.add_argument("--name", default="cli", help="a label to know it by")
    parser.add_argument("--group", action="append", default=[], metavar="GROUP",
                        help="the owner's provider group (repeatable): the team its tasks count under (auth.teams)")


def list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--owner", help="only this owner's tokens")
    parser.add_argument("--json", action="store_true", help="one JSON object per token")


def revoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", help="the token's id (tasuki token list)")


def cmd_token_create(args: argparse.Namespace, settings: Settings) -> int:
    """Make a token and print its secret, once: it is stored only as a hash."""
    from contexts.clock import utc_now
    from worker.api_tokens import issue_token, role_named, token_store
    from worker.roles import Role

    token, secret = issue_token(settings, token_store(settings), owner=args.owner, owner_role=Role.ADMIN,
                                groups=args.group, role=role_named(args.role), expires_days=args.days,
                                name=args.name, now=utc_now())
    record_cli(settings, "token.create", token.id,
               detail={"owner": token.owner, "role": token.role, "expires_at": token.expires_at.isoformat()})
    out(secret)
    out(f"# token {token.id} of {token.owner} ({token.role}), expires {token.expires_at:%Y-%m-%d %H:%M} UTC; "
        "shown this once")
    return EXIT_OK


def cmd_token_list(args: argparse.Namespace, settings: Settings) -> int:
    """The tokens (never their secrets), newest first."""
    from contexts.clock import utc_now
    from worker.api_tokens import token_store

    now = utc_now()
    for token in token_store(settings).list(args.owner):
        if args.json:
            out(json.dumps({"id": token.id, "owner": token.owner, "name": token.name, "role": token.role,
                            "groups": list(token.groups), "created_at": token.created_at.isoformat(),
                            "expires_at": token.expires_at.isoformat(), "status": token.status(now)}))
        else:
            out(f"{token.id}  {token.owner}  {token.role:<8}  {token.status(now):<7}  "
                f"expires {token.expires_at:%Y-%m-%d}  {token.name}")
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace, settings: Settings) -> int:
    """Revoke a token from now on (the API refuses it at its next request)."""
    from contexts.clock import utc_now
    from worker.api_tokens import token_store

    token = token_store(settings).revoke(args.id, utc_now())
    record_cli(settings, "token.revoke", token.id, detail={"owner": token.owner, "role": token.role})
    out(f"revoked token {token.id} of {token.owner}")
    return EXIT_OK
