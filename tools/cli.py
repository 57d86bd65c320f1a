"""What every command-line tool of the project shares.

- Argument types that refuse bad input while the arguments are parsed, so argparse prints one
  line naming the option and the allowed values and exits 2, before any work or any file write:
  `int_at_least`, `float_at_least`, `int_list`, `http_url`, `task_list`, `task_id`, `names_from`, `writable_file`,
  `writable_dir`.
- `ArgumentParser`: argparse's parser whose refusal is one line (the usage block it printed first
  buried the line that says what is wrong), named for the command as it was typed (`llmserve-env
  evaluate`, not `python tools/evaluate.py`, when the console script ran it: `invoked_as`).
- `HelpFormatter`: the module docstring as written, and every option's default in `--help`.
- `add_output_options` / `configure_logging`: `--quiet` and `--log-level` on every CLI, and
  logging on stderr (so the gateway's retry warnings and the like are seen).
- `progress` / `EpisodeCounter`: tqdm bars on stderr, shown only on a terminal and without `--quiet`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from llmserve_env.shared.tasks import TASKS, UnknownTaskError, parse_task_ids

T = TypeVar("T")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Docstrings keep their layout; each option's help ends with its default."""


# The name the running command was typed as, when a dispatcher (`llmserve-env COMMAND`) ran it.
_invoked_as: str | None = None


@contextlib.contextmanager
def invoked_as(prog: str) -> Iterator[None]:
    """Parsers made inside this block call themselves `prog` in their usage and errors."""
    global _invoked_as
    before, _invoked_as = _invoked_as, prog
    try:
        yield
    finally:
        _invoked_as = before


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with a one-line refusal: `PROG: error: MESSAGE (PROG --help lists the
    options)` on stderr, exit 2. Under `invoked_as`, PROG is the command as typed."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # a subcommand's parser is named after its parent's prog, already the typed one
        if _invoked_as is not None and not self.prog.startswith(_invoked_as):
            self.prog = _invoked_as

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")


def one_line(exc: BaseException) -> str:
    """An error as one line: pydantic's errors as `field: message` joined by '; ', else its first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in errors())
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def port(text: str) -> int:
    """A TCP port, 1-65535 (uvicorn raised a 72-line OverflowError for 99999)."""
    value = int_at_least(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {value}")
    return value


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= `low` (argparse names the option when this raises)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def float_at_least(low: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number >= {low:g}, got {text!r}") from None
        if not value >= low:  # also refuses nan
            raise argparse.ArgumentTypeError(f"expected a number >= {low:g}, got {text}")
        return value

    parse.__name__ = f"number >= {low:g}"
    return parse


def int_list(low: int) -> Callable[[str], list[int]]:
    """Comma-separated integers, each >= `low` (e.g. 1,10,50)."""
    one = int_at_least(low)

    def parse(text: str) -> list[int]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {low}, e.g. {low},10")
        return [one(t) for t in items]

    return parse


def http_url(text: str) -> str:
    """An http:// or https:// URL (no trailing slash)."""
    if not text.startswith(("http://", "https://")) or not text.split("://", 1)[1].strip("/"):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text.rstrip("/")


def task_list(text: str) -> list[str]:
    """Comma-separated built-in task ids, or 'all'."""
    try:
        return parse_task_ids(text)
    except UnknownTaskError as exc:
        raise argparse.ArgumentTypeError(
            f"unknown task {exc.task_id!r}; choose from {', '.join(exc.valid)} (or 'all')") from None


def task_id(text: str) -> str:
    """One built-in task id."""
    if text not in TASKS:
        raise argparse.ArgumentTypeError(f"unknown task {text!r}; choose from {', '.join(sorted(TASKS))}")
    return text


def names_from(allowed: Iterable[str], everything: Iterable[str] | None = None) -> Callable[[str], list[str]]:
    """Comma-separated names out of `allowed`; 'all' stands for `everything` (default: `allowed`)."""
    allowed = list(allowed)
    every = list(everything) if everything is not None else allowed

    def parse(text: str) -> list[str]:
        if text == "all":
            return every
        names = [n.strip() for n in text.split(",") if n.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"expected names from {', '.join(allowed)} (or 'all')")
        for n in names:
            if n not in allowed:
                raise argparse.ArgumentTypeError(f"unknown name {n!r}; choose from {', '.join(allowed)} (or 'all')")
        return names

    return parse


def writable_file(text: str) -> Path:
    """A file path this process can create or overwrite, checked before any work is done: its
    folder must exist and be writable (as for a shell redirection), and it must not be a folder."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file path")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path


def writable_dir(text: str) -> Path:
    """A folder this process can write into. It may not exist yet (it is made when first written),
    but then its nearest existing ancestor must be a writable folder."""
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    ancestor = path.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write into {text}: {ancestor} is not a writable folder")
    return path


def add_output_options(ap: argparse.ArgumentParser) -> None:
    """--quiet (no progress bars, warnings only) and --log-level."""
    ap.add_argument("--quiet", "-q", action="store_true", help="no progress bars; log warnings and errors only")
    ap.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="INFO",
                    help="log messages at this level and above (on stderr)")


def configure_logging(args: argparse.Namespace | None = None) -> None:
    """Logging on stderr at --log-level (WARNING under --quiet); libraries' chatter stays at WARNING."""
    level = "INFO" if args is None else getattr(args, "log_level", "INFO")
    if args is not None and getattr(args, "quiet", False) and level in ("DEBUG", "INFO"):
        level = "WARNING"
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s", force=True)
    for noisy in ("httpx", "httpcore", "urllib3", "asyncio", "matplotlib", "gradio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def progress_enabled(quiet: bool = False) -> bool:
    return not quiet and sys.stderr.isatty()


def progress(iterable: Iterable[T], *, total: int | None = None, desc: str = "", quiet: bool = False,
             unit: str = "it", **kwargs: Any) -> Iterable[T]:
    """`iterable` with a progress bar on stderr when it is a terminal and not --quiet."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr,
                disable=not progress_enabled(quiet), dynamic_ncols=True, leave=False, **kwargs)


class EpisodeCounter:
    """An episode environment (reset/step/grade) that ticks a progress bar at every reset: progress
    for searches whose number of episodes is not known in advance (tuning, calibration)."""

    def __init__(self, env: Any, desc: str, quiet: bool = False):
        from tqdm import tqdm

        self.env = env
        self.bar = tqdm(desc=desc, unit="ep", file=sys.stderr, disable=not progress_enabled(quiet),
                        dynamic_ncols=True, leave=False)

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        self.bar.update(1)
        return self.env.reset(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def close(self) -> None:
        self.bar.close()
