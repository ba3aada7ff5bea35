"""`ckptfs import-langgraph SOURCE URL`: threads from a SqliteSaver or PostgresSaver into ckptfs.

SOURCE is a SqliteSaver file (`sqlite:///relative/path`, `sqlite:////absolute/path`, or a path
ending .sqlite/.sqlite3/.db), opened read-only, or a PostgresSaver DSN (`postgresql://...`,
its password scrubbed from every message). URL is the ckptfs store, addressed as every command
addresses it. Rerunnable: what is already in the store is skipped. Needs the langgraph extra
(and langgraph-checkpoint-sqlite / -postgres for the source).

Exit codes: 0 every thread copied; 1 some thread could not be (another process writes it in
the store: `ThreadBusyError`; an id over the saver's limits: `InvalidIdError`; a row the source
cannot read back: `UnreadableThreadError`; another history under its id in the store:
`ForeignThreadError`), each named with its reason, the others copied;
2 usage error, a SOURCE that is not a saver's, an unreachable store.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

from ckptfs.cli._common import EXIT_OK, EXIT_PROBLEMS, CliError, emit_json, err, out, warn
from ckptfs.cli._logging import SCRUBBER
from ckptfs.cli._options import add_json_arg, add_store_args, refuse_process_memory, store_target
from ckptfs.cli._render import clip


def register(sub: Any) -> None:
    """Add import-langgraph to the `ckptfs` parser."""
    p = sub.add_parser(
        "import-langgraph", help="copy every thread of a SqliteSaver / PostgresSaver into a store",
        description="Copy every LangGraph thread (history, metadata, pending writes) of a SqliteSaver "
                    "file or a PostgresSaver database into a ckptfs store, where CkptfsSaver resumes "
                    "them. Rerunnable: checkpoints already in the store are skipped.")
    p.add_argument("source", metavar="SOURCE",
                   help="sqlite:///path (or a .sqlite/.db path), or postgresql://user:pass@host/db")
    add_store_args(p)
    p.add_argument("--thread", dest="threads", action="append", metavar="ID",
                   help="import only this thread (repeatable)")
    add_json_arg(p)
    p.set_defaults(handler=cmd_import_langgraph)


def cmd_import_langgraph(args: argparse.Namespace) -> int:
    try:
        password = urlsplit(args.source).password
    except ValueError:  # "Invalid IPv6 URL": libpq says what is wrong with it, below
        password = None
    if password:
        SCRUBBER.add([password])
    from rich.markup import escape

    try:
        from ckptfs.integrations.langgraph import CkptfsSaver
        from ckptfs.integrations.langgraph.importer import import_threads, open_source
    except ImportError as exc:
        raise CliError(f"import-langgraph needs LangGraph: pip install 'ckptfs[langgraph]' ({exc})") from None
    target = store_target(args)
    if not target.url:
        raise CliError("no store URL: give URL, --config with store.url, or $CKPTFS_URL")
    refuse_process_memory(target.url, target.describe(), "import-langgraph")
    try:
        source = open_source(args.source)
    except ImportError as exc:
        raise CliError(f"reading {args.source.split(':', 1)[0]} needs its LangGraph saver package "
                       f"(langgraph-checkpoint-sqlite / langgraph-checkpoint-postgres): {exc}") from None
    try:
        if args.threads:  # a --thread the source does not hold is bad input, as a --run is
            known = set(source.thread_ids())
            unknown = [t for t in dict.fromkeys(args.threads) if t not in known]
            if unknown:
                raise CliError(f"thread{'s' if len(unknown) > 1 else ''} "
                               f"{', '.join(repr(t[:60]) for t in unknown)} not found in "
                               f"{source.display}; nothing imported", kind="not-found")
        with CkptfsSaver(target.url, target.options) as dest:
            if args.json or not err().is_terminal:
                report = import_threads(source, dest, args.threads)
            else:
                with err().status("importing") as status:
                    def tick(thread_id: str, copied: int) -> None:
                        last = escape(thread_id[:40])  # an id is text, not markup
                        status.update(f"importing: {copied} checkpoint(s), last thread {last}")

                    report = import_threads(source, dest, args.threads, tick)
    finally:
        source.close()
    if args.json:
        emit_json({"command": "import-langgraph", "url": target.describe(), **report.to_dict()})
    else:
        for thread_id, why in sorted(report.failed.items()):
            warn(f"thread {clip(thread_id)!r} not imported: {why}")
        out().print(f"{'[green]imported[/green]' if report.ok else '[red]incomplete[/red]'}: "
                    f"{report.threads} thread(s) from {escape(report.source)}: {report.checkpoints} "
                    f"checkpoint(s) copied, {report.skipped} already there, {report.writes} "
                    f"pending-write object(s) -> {escape(target.describe())}")
    return EXIT_OK if report.ok else EXIT_PROBLEMS
