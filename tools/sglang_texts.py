#!/usr/bin/env python3
"""SGLang's memory-failure texts, read from a release: a maintainer tool (CONTRIBUTING "A new SGLang release").

Given an SGLang wheel (.whl) or a source tree, it walks every Python file with `ast` and lists each `raise`, each
exception built to be raised elsewhere (`construct`), `assert` with a message, `logger.*` / `logging.*` call and
`warnings.warn` whose message, enclosing function or file speaks of memory (the vocabulary below, the one place
that says what that means), with the file, the line, the call, the enclosing function and the message as a pattern:
the literal text with `*` where an f-string hole, a `%s` or a `{}` goes, `A | B` for a conditional expression's two
texts, and `{?part}` for a part added on some paths only (`msg += ...` under an `if`). Its key (file, function,
call, message) survives line shifts, so an inventory (tools/sglang-texts/<release>.yaml) maps each text once, to a
catalog kind and the golden case that proves it, or to an exclusion and its reason, and the next release is a list
of keys the inventory does not have.

    python tools/sglang_texts.py list sglang-0.5.23-*.whl                 # every text, as YAML
    python tools/sglang_texts.py check sglang-0.5.24-*.whl --inventory tools/sglang-texts/0.5.23.yaml
    python tools/sglang_texts.py draft sglang-0.5.24-*.whl --inventory tools/sglang-texts/0.5.23.yaml

`check` exits 1 and lists the texts the inventory has neither mapped nor excluded (and, for information, the
inventory's texts the release no longer has); `draft` prints the inventory for the release, keeping the decisions
of the rows whose key it still has and leaving `decide:` on each new one, for a person to settle.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

# The vocabulary, in one place. A text is listed when it is SGLang's server runtime (SCOPE: the package's `srt/`,
# whose logs the exporter reads; kernels, benchmarks, tests and the diffusion server `multimodal_gen/` are not), is
# not a debug log or a programming error (SKIPPED_LOGS, SKIPPED_CLASSES), and
#  - its message speaks of memory (MESSAGE), or
#  - it fails (FAILING_CALLS) inside a function whose name speaks of allocation, pools, retraction or eviction
#    (FUNCTION), or
#  - it fails in a file whose name speaks of memory (FILE) with a message the source does not spell (a variable).
SCOPE = "srt/"
MESSAGE = re.compile(
    r"out of mem|\boom\b|memory|\bhbm\b|vram|not enough|exhausted|too small|no space|insufficient|no room|"
    r"cannot (?:hold|fit)|can ?not alloc|cannot alloc|failed to alloc|alloc\w* (?:failed|returned none)|null pointer|"
    r"leak|double free|use-after-free|is full\b|runs? out|retract|\babort|\bevict",
    re.IGNORECASE,
)
FUNCTION = re.compile(r"alloc|memory_pool|init_memory|retract|evict", re.IGNORECASE)
FILE = re.compile(r"alloc|memory_pool|mem_cache/|kv_cache_configurator|pool_configurator", re.IGNORECASE)
FAILING_CALLS = ("raise", "construct", "assert", "logger.error", "logger.exception", "logger.critical", "logger.fatal",
                 "logger.warning", "logger.warn", "logging.error", "logging.exception", "logging.critical",
                 "logging.warning", "warnings.warn")  # fmt: skip
SKIPPED_LOGS = ("logger.debug", "logging.debug")
# Programming errors, raised or built: never memory.
SKIPPED_CLASSES = ("NotImplementedError", "TypeError", "ImportError", "ModuleNotFoundError", "KeyError",
                   "AttributeError", "IndexError")  # fmt: skip
LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log"}
LOG_OWNERS = {"logger", "logging", "_logger", "log", "LOGGER", "logger_"}
HOLE = "*"
OPTIONAL = "<optional>"  # marks a part a message gains on some paths only: written "{?part}"


@dataclass(frozen=True, order=True)
class Text:
    """One text of a release. The key is (file, function, call, message); `line` only says where it was."""

    file: str
    function: str
    call: str
    message: str
    line: int

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.file, self.function, self.call, self.message)

    def row(self) -> dict[str, Any]:
        return {"file": self.file, "function": self.function, "call": self.call, "message": self.message,
                "line": self.line}  # fmt: skip


def _printf_holes(text: str) -> str:
    return re.sub(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?[sdrfgeixXcu%]",
                  lambda m: "%" if m.group() == "%%" else HOLE, text)  # fmt: skip


def _format_holes(text: str) -> str:
    return re.sub(r"\{[^{}]*\}", HOLE, text).replace("{{", "{").replace("}}", "}")


class _Messages:
    """The message of an expression as a pattern, following names assigned earlier in the same function."""

    def __init__(self, assigned: dict[str, ast.expr]) -> None:
        self.assigned = assigned
        self.depth = 0

    def of(self, node: ast.expr | None) -> str:
        if node is None:
            return ""
        self.depth += 1
        try:
            if self.depth > 8:
                return HOLE
            return self._of(node)
        finally:
            self.depth -= 1

    def _of(self, node: ast.expr) -> str:
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str) else HOLE
        if isinstance(node, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else HOLE
                           for v in node.values)  # fmt: skip
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.of(node.left) + self.of(node.right)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return _printf_holes(self.of(node.left))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
                and isinstance(node.func.value, (ast.Constant, ast.JoinedStr, ast.Name))):  # fmt: skip
            return _format_holes(self.of(node.func.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
            return HOLE
        if isinstance(node, ast.Name) and node.id in self.assigned:
            return self.of(self.assigned[node.id])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == OPTIONAL:
            return "{?" + self.of(node.args[0]) + "}"
        if isinstance(node, ast.IfExp):
            return self.of(node.body) + " | " + self.of(node.orelse)
        return HOLE

    def of_call(self, call: ast.Call) -> str:
        """A raised exception's or a warning's message: its first argument (a class raised bare says nothing)."""
        return self.of(call.args[0]) if call.args else ""


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    if isinstance(node, ast.Call):
        return _name(node.func)
    return HOLE


def _collapse(message: str) -> str:
    """One line per message: SGLang's texts are matched line by line, and a key must not depend on indentation."""
    return re.sub(r"[ \t]*\n[ \t]*", "\\\\n", message).strip()


class _Walker(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file = file
        self.scope: list[str] = []
        self.assigned: list[dict[str, ast.expr]] = [{}]
        self.found: list[Text] = []
        self.raised: set[int] = set()  # the exception calls a raise statement already listed
        self.branch = 0  # how many if/for/while/try/with bodies deep the walk is, within its function
        self.assigned_at: dict[tuple[int, str], int] = {}  # (function level, name) -> branch depth of its assignment

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        if not isinstance(node, ast.ClassDef):
            self.assigned.append({})
        self.generic_visit(node)
        if not isinstance(node, ast.ClassDef):
            self.assigned.pop()
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._function(node)

    def _branch(self, node: ast.AST) -> None:
        self.branch += 1
        self.generic_visit(node)
        self.branch -= 1

    def visit_If(self, node: ast.If) -> None:  # a message grown in a branch has two forms
        self._branch(node)

    def visit_For(self, node: ast.For) -> None:
        self._branch(node)

    def visit_While(self, node: ast.While) -> None:
        self._branch(node)

    def visit_Try(self, node: ast.Try) -> None:
        self._branch(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.assigned[-1][target.id] = node.value
                self.assigned_at[(len(self.assigned), target.id)] = self.branch
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        name = node.target.id if isinstance(node.target, ast.Name) else ""
        if name in self.assigned[-1] and isinstance(node.op, ast.Add):
            before = self.assigned[-1][name]
            grown = ast.BinOp(before, ast.Add(), node.value)
            # Grown only on some paths (msg += ... under an if or in a loop): the part is optional, "A{?B}".
            if self.branch > self.assigned_at.get((len(self.assigned), name), 0):
                grown = ast.BinOp(before, ast.Add(), ast.Call(ast.Name(OPTIONAL), [node.value], []))
            self.assigned[-1][name] = grown
        self.generic_visit(node)

    def _add(self, node: ast.AST, call: str, message: str) -> None:
        function = ".".join(self.scope) or "<module>"
        message = _collapse(message)
        if listed(self.file, self.scope[-1] if self.scope else "", call, message):
            self.found.append(Text(self.file, function, call, message, node.lineno))  # type: ignore[attr-defined]

    def visit_Raise(self, node: ast.Raise) -> None:
        messages = _Messages(self.assigned[-1])
        exc = node.exc
        if isinstance(exc, ast.Call):
            self.raised.add(id(exc))
            self._add(node, f"raise {_name(exc.func)}", messages.of_call(exc))
        elif exc is not None:
            self._add(node, f"raise {_name(exc)}", "")
        self.generic_visit(node)

    def visit_Assert(self, node: ast.Assert) -> None:
        if node.msg is not None:
            self._add(node, "assert", _Messages(self.assigned[-1]).of(node.msg))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = _name(func.value).split(".")[-1]
            messages = _Messages(self.assigned[-1])
            if func.attr in LOG_METHODS and owner in LOG_OWNERS:
                args = node.args[1:] if func.attr == "log" else node.args
                message = messages.of(args[0]) if args else ""
                if len(args) > 1:
                    message = _printf_holes(message)
                self._add(node, f"{owner}.{func.attr}", message)
            elif func.attr == "warn" and owner == "warnings":
                self._add(node, "warnings.warn", messages.of_call(node))
        # An exception built here and raised elsewhere (`return RuntimeError(...)` in a helper): its text too.
        name = _name(func).split(".")[-1]
        if node.args and id(node) not in self.raised and name.endswith(("Error", "Exception")):
            self._add(node, f"construct {name}", _Messages(self.assigned[-1]).of_call(node))
        self.generic_visit(node)


def listed(file: str, function: str, call: str, message: str) -> bool:
    """Does the vocabulary list this text (file relative to the package, the innermost function's name)?"""
    if not file.startswith(SCOPE) or call in SKIPPED_LOGS or call.split(".")[-1].split()[-1] in SKIPPED_CLASSES:
        return False
    if MESSAGE.search(message):
        return True
    failing = call.startswith(FAILING_CALLS)
    unspelt = not message.replace(HOLE, "").strip()
    return failing and (FUNCTION.search(function) is not None or (unspelt and FILE.search(file) is not None))


def texts_of_source(file: str, source: str) -> list[Text]:
    """The texts of one Python file (its path relative to the package, POSIX); a file that does not parse has none."""
    try:
        tree = ast.parse(source, filename=file)
    except (SyntaxError, ValueError):
        return []
    walker = _Walker(file)
    walker.visit(tree)
    return walker.found


def _sources(path: Path) -> Iterator[tuple[str, str]]:
    """(path under the `sglang` package, text) of each Python file of a wheel or a tree, in a fixed order."""
    if path.is_file():
        with zipfile.ZipFile(path) as wheel:
            for name in sorted(wheel.namelist()):
                if name.endswith(".py") and name.startswith("sglang/"):
                    yield name[len("sglang/"):], io.TextIOWrapper(wheel.open(name), encoding="utf-8",
                                                                  errors="replace").read()  # fmt: skip
        return
    root = path / "sglang" if (path / "sglang").is_dir() else path
    for file in sorted(root.rglob("*.py")):
        yield str(PurePosixPath(file.relative_to(root))), file.read_text(encoding="utf-8", errors="replace")


def release_texts(path: Path) -> list[Text]:
    """Every text of a release, sorted by key; a key that occurs more than once keeps its first line."""
    seen: dict[tuple[str, str, str, str], Text] = {}
    for file, source in _sources(path):
        if not file.startswith(SCOPE):
            continue
        for text in texts_of_source(file, source):
            seen.setdefault(text.key, text)
    return sorted(seen.values(), key=lambda t: t.key)


def release_version(path: Path) -> str:
    """The release a wheel's name (sglang-<version>-...) or an unpacked wheel's dist-info says."""
    match = re.match(r"sglang-([^-]+)-", path.name)
    if path.is_file() and match:
        return match.group(1)
    for metadata in sorted(path.glob("sglang-*.dist-info/METADATA")):
        found = re.search(r"^Version: (\S+)", metadata.read_text(encoding="utf-8"), re.MULTILINE)
        if found:
            return found.group(1)
    return "unknown"


def row_key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    return (str(row["file"]), str(row["function"]), str(row["call"]), str(row["message"]))


def load_inventory(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("texts"), list):
        raise SystemExit(f"{path}: not an inventory (a mapping with a `texts:` list)")
    return data


def undecided(inventory: dict[str, Any]) -> list[dict[str, Any]]:
    """The inventory's rows that neither map to a kind nor say why not (`kind:` or `excluded:`)."""
    return [row for row in inventory["texts"] if not row.get("kind") and not row.get("excluded")]


def compare(texts: list[Text], inventory: dict[str, Any]) -> tuple[list[Text], list[dict[str, Any]]]:
    """(the release's texts the inventory has no row for, the inventory's rows the release no longer has)."""
    known = {row_key(row) for row in inventory["texts"]}
    have = {t.key for t in texts}
    return [t for t in texts if t.key not in known], [r for r in inventory["texts"] if row_key(r) not in have]


def _describe(text: Text | dict[str, Any]) -> str:
    row = text.row() if isinstance(text, Text) else text
    return f"  {row['file']}:{row.get('line', '?')} {row['function']}: {row['call']} {row['message']!r}"


def draft(texts: list[Text], inventory: dict[str, Any] | None, release: str, source: str = "") -> dict[str, Any]:
    """The inventory of a release: the rows of `inventory` whose key it still has (decision kept, line updated),
    a new row with `decide:` for each other text."""
    old = {row_key(r): r for r in (inventory or {}).get("texts", [])}
    rows = []
    for text in texts:
        row = text.row()
        decision = {k: v for k, v in old.get(text.key, {}).items() if k not in row}
        rows.append({**row, **(decision or {"decide": "kind + golden, or excluded + reason"})})
    head = {k: v for k, v in (inventory or {}).items() if k not in ("texts", "release", "source")}
    return {"release": release, **({"source": source} if source else {}), **head, "texts": rows}


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (
        ("list", "print every text of the release as YAML"),
        ("check", "exit 1 listing the texts the inventory neither maps nor excludes"),
        ("draft", "print the release's inventory: kept decisions, `decide:` on each new text"),
    )
    for name, text in commands:
        command = sub.add_parser(name, help=text)
        command.add_argument("release", type=Path, help="an SGLang wheel (.whl) or source tree")
        if name != "list":
            command.add_argument("--inventory", type=Path, required=name == "check",
                                 help="an inventory, tools/sglang-texts/<release>.yaml")  # fmt: skip
    args = parser.parse_args(argv)
    if not args.release.exists():
        parser.error(f"{args.release}: no such wheel or source tree")
    texts = release_texts(args.release)
    if args.command == "list":
        sys.stdout.write(dump({"release": release_version(args.release), "texts": [t.row() for t in texts]}))
        return 0
    inventory = load_inventory(args.inventory) if args.inventory else None
    if args.command == "draft":
        sys.stdout.write(dump(draft(texts, inventory, release_version(args.release), args.release.name)))
        return 0
    if inventory is None:
        parser.error("check needs --inventory")
    new, gone = compare(texts, inventory)
    open_rows = undecided(inventory)
    release = release_version(args.release)
    print(f"SGLang {release}: {len(texts)} memory texts; inventory {args.inventory} ({inventory.get('release')}): "
          f"{len(new)} new, {len(gone)} no longer in the release, {len(open_rows)} undecided")  # fmt: skip
    if new:
        print(f"Texts of {release} the inventory neither maps nor excludes:")
        print("\n".join(_describe(t) for t in new))
    if open_rows:
        print("Rows of the inventory with neither `kind:` nor `excluded:`:")
        print("\n".join(_describe(r) for r in open_rows))
    if gone:
        print(f"Rows of the inventory {release} no longer has (reworded or removed):")
        print("\n".join(_describe(r) for r in gone))
    return 1 if new or open_rows else 0


if __name__ == "__main__":
    sys.exit(main())
