"""The entry point: every command registered, errors turned into one line and an exit code.

Exit codes: 0 ran and nothing failed; 1 a backend was nondeterministic, a
cross-backend difference exceeded --max-ulp, or a backend failed or was
unavailable while others ran (`diff`: the two reports differ); 2 usage or input
error; 3 every backend failed; 4 internal error; 10-15, 17-19 the --fail-on policy
that fired (xbackend.gating); 16 a runner broke a promise; 130 interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

import xbackend.cli.fleet
import xbackend.cli.release
import xbackend.cli.run
import xbackend.cli.tools  # noqa: F401  (these four register their commands with the app)
from xbackend.cli.app import app
from xbackend.errors import EXIT_INTERNAL, EXIT_USAGE, XbackendError

__all__ = ["app", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = app(
            args=list(sys.argv[1:] if argv is None else argv), prog_name="xbackend", standalone_mode=False
        )
        return int(code or 0)
    except XbackendError as e:
        print(f"xbackend: error: {e}", file=sys.stderr)
        return e.exit_code
    except typer.Exit as e:
        return int(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        print("xbackend: interrupted", file=sys.stderr)
        return 130
    except typer.TyperException as e:  # typer's own usage errors: unknown option, missing argument
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        hint = _help_hint(argv)
        print(f"xbackend: error: {' '.join(msg.split()).rstrip('.')}; see `{hint}`", file=sys.stderr)
        return int(getattr(e, "exit_code", EXIT_USAGE))
    except Exception as e:  # a bug in xbackend, not in the user's input
        print(f"xbackend: internal error: {type(e).__name__}: {e}; please report it", file=sys.stderr)
        return EXIT_INTERNAL


def _help_hint(argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    cmds = {"compare", "capture", "certify", "verify", "report", "diff", "backends", "export", "sweep"}
    cmds.add("keygen")
    first = next((a for a in args if not a.startswith("-")), None)
    if first in cmds:
        sub = " torch" if first == "export" and "torch" in args else ""
        return f"xbackend {first}{sub} --help"
    return "xbackend --help"
