"""Mutation check of the alert pack: can each alert's promtool tests tell its rule from a slightly wrong one?

For every rule of the committed pack (alerts/sglang-oom.rules.yaml), alerts and recording rules alike, this makes
mutants, each one small change to the rule, and runs the test files of the alerts it can change against a copy of the
pack with the mutated rule (tests/support/promtool_rules.py, as tests/test_alerts.py runs the tests): an alert's own
file (tests/rules/<alert lowercased>.test.yaml), and for a recording rule the files of every alert that reads it,
directly or through another record (a family's first member standing for the family). A mutant is killed when
`promtool test rules` fails on one of them. The operators:

- number: each number literal doubled, 0 -> 1;
- range, offset: each range selector's range and each offset times 3;
- comparison: `>` -> `>=`, `<` -> `<=`, `>=` -> `>`, `<=` -> `<`, `==` -> `!=`, `!=` -> `==`;
- drop: each branch of an `or`, `and` or `unless` dropped (a chain `a or b or c` gives three mutants);
- kind: each `kind="..."` matcher set to the next kind of the catalog;
- for, keep_firing_for: doubled (0 -> 1m) and halved.

How it runs: each test file is cut into one file per test case (promtool evaluates a case on its own, so the
cases of a file pass together exactly when the file passes), and the mutants go in rounds: every mutant still
alive runs its next case, cheapest first (evaluation steps times input series), all of a round's cases in a few
`promtool test rules` processes, `--jobs` at a time. A mutant is killed by the first case that fails and runs no
more; a survivor runs every case of every file that judges it, as before. Most mutants die on their first or
second case, so the check evaluates a small part of the cases it used to.

Mutation points come from a real PromQL parser (promql-parser); the mutated expression is printed by it, so a
control run first proves each alert's tests pass on its printed, unmutated rule. A mutant that promtool's
`check rules` rejects is not valid and is counted apart.

Alerts that share one shape (the fatal-kind alerts: the same rule up to the kind) are a family: the first in
the pack is run under promtool, and each other member's mutants are killed by the structural test
(tests/test_alerts_mutation.py), which holds every member equal to the first with only the kind changed; any
mutant breaks that equality, and `shape()` here is that test's predicate.

A surviving mutant must be listed, with the reason it cannot change behaviour, in
tests/rules/equivalent-mutants.yaml (alert, operator, site, change: no line numbers; `alert` names the rule, a
recording rule by its record name). The check fails on any
unlisted survivor, on a listed entry that no longer survives (stale), on a failing control, and when fewer than
90 % of the valid mutants are killed. `--suggest` prints the entries for new survivors, ready to paste.

Run: python tools/mutate_alerts.py [--jobs 2] [--alert NAME ...] [--suggest] [--json FILE]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser as pp
import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sglang_oom_exporter.catalog import load_catalog  # noqa: E402 - the checkout's package, after its root
from sglang_oom_exporter.config.values import parse_duration  # noqa: E402
from tests.support.helpers import dump_yaml, load_yaml  # noqa: E402
from tests.support.promtool_rules import RULES, isolate  # noqa: E402

RULE_TESTS = ROOT / "tests" / "rules"
EQUIVALENTS = RULE_TESTS / "equivalent-mutants.yaml"
MIN_KILLED_PERCENT = 90.0
COMPARISONS = {">": ">=", "<": "<=", ">=": ">", "<=": "<", "==": "!=", "!=": "=="}
SET_OPS = ("or", "and", "unless")
KIND_RE = re.compile(r'kind="([^"]*)"')
SITE_WIDTH = 100  # longer sites keep their head and tail


@dataclass(frozen=True)
class Mutant:
    """One changed rule of one alert. The key (alert, operator, site, change) names it without line numbers."""

    alert: str
    operator: str
    site: str  # the changed piece of the expression, selectors shown without matchers
    change: str
    rule: dict[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """The stable name of the mutant, as equivalent-mutants.yaml lists it."""
        return (self.alert, self.operator, self.site, self.change)


@dataclass
class Outcome:
    """What the check found for one mutant."""

    mutant: Mutant
    status: str  # killed, killed-by-structure, survived, equivalent, invalid, unjudged (its control failed)
    reason: str = ""
    cases: int = 0  # promtool test cases run for it: a killed mutant stops at the first that fails


# --- finding the mutation points ----------------------------------------------------------------------------


def _condense(text: str) -> str:
    """An expression piece as a site names it: no label matchers, single spaces."""
    return re.sub(r"\s+", " ", re.sub(r"\{[^{}]*\}", "", text)).strip()


def _short(text: str) -> str:
    """A condensed piece cut in the middle when long."""
    text = _condense(text)
    if len(text) <= SITE_WIDTH:
        return text
    half = (SITE_WIDTH - 3) // 2
    return f"{text[:half]} … {text[-half:]}"


def _duration(delta: datetime.timedelta) -> str:
    return str(pp.display_duration(delta))


def _nodes(expr: Any) -> list[tuple[Any, list[Any]]]:
    """Every node of the expression in the parser's depth-first order, with its ancestors (nearest last)."""
    found: list[tuple[Any, list[Any]]] = []
    stack: list[Any] = []

    def pre(node: Any) -> None:
        found.append((node, list(stack)))
        stack.append(node)

    def post(node: Any) -> None:
        stack.pop()

    pp.walk(expr, pre_visit=pre, post_visit=post)
    return found


def _replace(expr: Any, index: int, text: str) -> str:
    """The expression with its index-th node (in _nodes order) replaced by the parsed text, printed."""
    seen = [-1]
    replacement = pp.parse(text)

    def pre(node: Any) -> Any:
        seen[0] += 1
        return replacement if seen[0] == index else None

    return str(pp.transform(expr, pre_visit=pre))


def _context(ancestors: list[Any]) -> str:
    """The nearest enclosing piece that is not a parenthesis or a range selector."""
    for node in reversed(ancestors):
        if not isinstance(node, pp.ParenExpr | pp.MatrixSelector):
            return _short(str(node))
    return ""


def _binary_text(node: Any, op: str) -> str:
    """The binary expression printed with another operator (its operands and modifiers kept)."""
    whole, lhs, rhs = str(node), str(node.lhs), str(node.rhs)
    if not (whole.startswith(lhs) and whole.endswith(rhs)):
        raise ValueError(f"cannot find the operator of {whole}")
    middle = whole[len(lhs) : len(whole) - len(rhs)]
    new_middle = re.sub(r"(?<![<>=!])(>=|<=|==|!=|>|<)(?![=])", op, middle, count=1)
    if new_middle == middle:
        raise ValueError(f"no comparison between the operands of {whole}")
    return lhs + new_middle + rhs


def _number(value: float) -> str:
    return f"{value:g}"


def _expression_mutants(expr_text: str, kinds: Sequence[str]) -> Iterator[tuple[str, str, str, str]]:
    """(operator, site, change, mutated expression) for every mutation point of one expression."""
    expr = pp.parse(expr_text)
    for index, (node, ancestors) in enumerate(_nodes(expr)):
        parent = ancestors[-1] if ancestors else None
        if isinstance(node, pp.NumberLiteral):
            doubled = 1.0 if node.val == 0 else node.val * 2
            site = _short(str(parent)) if parent is not None else _number(node.val)
            yield "number", site, f"{_number(node.val)} → {_number(doubled)}", _replace(expr, index, _number(doubled))
        elif isinstance(node, pp.MatrixSelector):
            text = str(node)
            site = _context([*ancestors, node])
            old = _duration(node.range)
            new = _duration(node.range * 3)
            yield "range", site, f"[{old}] → [{new}]", _replace(expr, index, text.replace(f"[{old}]", f"[{new}]", 1))
            yield from _selector_mutants(expr, index, node.vector_selector, text, site, kinds)
        elif isinstance(node, pp.VectorSelector) and not isinstance(parent, pp.MatrixSelector):
            yield from _selector_mutants(expr, index, node, str(node), _context(ancestors), kinds)
        elif isinstance(node, pp.BinaryExpr):
            op = str(node.op).strip()
            if op in COMPARISONS:
                yield (
                    "comparison",
                    _short(str(node)),
                    f"{op} → {COMPARISONS[op]}",
                    _replace(expr, index, _binary_text(node, COMPARISONS[op])),
                )
            elif op in SET_OPS:
                chained = isinstance(node.lhs, pp.BinaryExpr) and str(node.lhs.op).strip() == op
                yield "drop", _short(str(node.rhs)), f"drop this `{op}` branch", _replace(expr, index, str(node.lhs))
                if not chained:
                    yield (
                        "drop",
                        _short(str(node.lhs)),
                        f"drop this `{op}` branch",
                        _replace(expr, index, str(node.rhs)),
                    )


def _selector_mutants(
    expr: Any, index: int, selector: Any, text: str, site: str, kinds: Sequence[str]
) -> Iterator[tuple[str, str, str, str]]:
    """Offset and kind mutants of one selector; text is the node to replace (the selector or its range)."""
    if selector.offset is not None:
        old, new = _duration(selector.offset), _duration(selector.offset * 3)
        yield (
            "offset",
            site,
            f"offset {old} → {new}",
            _replace(expr, index, text.replace(f"offset {old}", f"offset {new}", 1)),
        )
    for kind in KIND_RE.findall(str(selector)):
        other = kinds[(kinds.index(kind) + 1) % len(kinds)] if kind in kinds else kinds[0]
        yield (
            "kind",
            f"{_condense(str(selector))} in {site}",
            f"{kind} → {other}",
            _replace(expr, index, text.replace(f'kind="{kind}"', f'kind="{other}"', 1)),
        )


def _durations(value: str) -> Iterator[tuple[str, str]]:
    seconds = parse_duration(value)
    doubled = seconds * 2 if seconds else 60
    yield f"{value} → {_duration(datetime.timedelta(seconds=doubled))}", _duration(datetime.timedelta(seconds=doubled))
    if seconds >= 120:
        half = _duration(datetime.timedelta(seconds=seconds / 2))
        yield f"{value} → {half}", half


def rule_name(rule: dict[str, Any]) -> str:
    """An alerting rule's alert name, a recording rule's record name."""
    return str(rule.get("alert") or rule["record"])


RECORDED_RE = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")


def readers(rules: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Recording rule -> the alerts that read it (in their expressions or their descriptions' queries),
    directly or through other recording rules, in pack order."""
    # An alert reads a record in its expression or in its description's query.
    reads = {rule_name(r): set(RECORDED_RE.findall(yaml.safe_dump(r))) - {rule_name(r)} for r in rules}
    out: dict[str, list[str]] = {}
    for record in (rule_name(r) for r in rules if "record" in r):
        found, todo = {record}, [record]
        while todo:
            current = todo.pop()
            for name, read in reads.items():
                if current in read and name not in found:
                    found.add(name)
                    todo.append(name)
        out[record] = [rule_name(r) for r in rules if "alert" in r and rule_name(r) in found]
    return out


def mutants(rule: dict[str, Any], kinds: Sequence[str]) -> list[Mutant]:
    """Every mutant of one rule; duplicate sites get #2, #3 in their order in the expression."""
    found: list[Mutant] = []
    name = rule_name(rule)
    for operator, site, change, expr in _expression_mutants(rule["expr"], kinds):
        found.append(Mutant(name, operator, site, change, {**rule, "expr": expr}))
    for field_ in ("for", "keep_firing_for"):
        if field_ in rule:
            for change, value in _durations(str(rule[field_])):
                found.append(Mutant(name, field_, f"{field_}: {rule[field_]}", change, {**rule, field_: value}))
    counts: dict[tuple[str, str, str, str], int] = {}
    named: list[Mutant] = []
    for m in found:
        counts[m.key] = counts.get(m.key, 0) + 1
        site = m.site if counts[m.key] == 1 else f"{m.site} #{counts[m.key]}"
        named.append(Mutant(m.alert, m.operator, site, m.change, m.rule))
    return named


# --- families: alerts of one shape ----------------------------------------------------------------------------


def shape(rule: dict[str, Any]) -> tuple[str, str, str]:
    """The rule with its kind taken out: expression (its one kind value replaced), for, keep_firing_for."""
    expr = str(rule["expr"])
    values = set(KIND_RE.findall(expr))
    if len(values) == 1:
        expr = expr.replace(f'kind="{values.pop()}"', 'kind="<kind>"')
    return expr, str(rule.get("for")), str(rule.get("keep_firing_for"))


def families(rules: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Member alert -> the family's first alert, for rules that share one shape with an earlier rule."""
    first: dict[tuple[str, str, str], str] = {}
    member: dict[str, str] = {}
    for rule in rules:
        key = shape(rule)
        if "alert" not in rule or len(set(KIND_RE.findall(rule["expr"]))) != 1:
            continue
        if key in first:
            member[rule["alert"]] = first[key]
        else:
            first[key] = rule["alert"]
    return member


# --- running promtool -------------------------------------------------------------------------------------------


def _run(argv: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # A hang guard: one batch of mutants takes about a minute alone and over five with both cores loaded.
    return subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, timeout=1800, check=False)  # noqa: S603


def _passed(stdout: str, names: Sequence[str], heading: str) -> set[str]:
    """The files promtool's output reports SUCCESS for (it prints one section per file, in order)."""
    ok = set()
    for section in stdout.split(heading)[1:]:
        name, _, rest = section.strip().partition("\n")
        if rest.strip().startswith("SUCCESS"):
            ok.add(name.strip())
    return ok & set(names)


def _in_batches(argv: Sequence[str], names: Sequence[str], cwd: Path, jobs: int, heading: str) -> set[str]:
    """Run `argv + batch` over the names in about 3 batches per job, jobs at a time; the names that passed."""
    if not names:
        return set()
    size = max(1, -(-len(names) // (jobs * 3)))
    batches = [list(names[i : i + size]) for i in range(0, len(names), size)]
    passed: set[str] = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for batch, proc in zip(batches, pool.map(lambda b: _run([*argv, *b], cwd), batches), strict=True):
            passed |= _passed(proc.stdout, batch, heading)
    return passed


def _test_file(alert: str) -> Path:
    return RULE_TESTS / f"{alert.lower()}.test.yaml"


def _replacing(name: str, rule: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        for group in data["groups"]:
            group["rules"] = [copy.deepcopy(rule) if rule_name(r) == name else r for r in group["rules"]]

    return change


def _case_cost(case: dict[str, Any], default_interval: str) -> float:
    """How much promtool evaluates for one test case: its evaluation steps times its input series (plus one)."""
    times = [
        parse_duration(str(t["eval_time"]))
        for key in ("alert_rule_test", "promql_expr_test")
        for t in case.get(key) or []
    ]
    step = parse_duration(str(case.get("interval") or default_interval)) or 60.0
    return (max(times, default=0.0) / step + 1) * (len(case.get("input_series") or []) + 1)


def _split_cases(out: Path, name: str, test: dict[str, Any]) -> list[tuple[float, str]]:
    """Write each test case of the test file `name` (in out, its document `test`) to a file of its own beside it,
    against the same rule file; (cost, file name) per case, cheapest first."""
    stem = name.removesuffix(".test.yaml")
    default = str(test.get("evaluation_interval") or "1m")
    cases = []
    for i, case in enumerate(test["tests"]):
        case_name = f"{stem}-c{i:02d}.test.yaml"
        (out / case_name).write_text(dump_yaml({**test, "tests": [case]}))
        cases.append((_case_cost(case, default), case_name))
    return sorted(cases)


# --- the check ------------------------------------------------------------------------------------------------------


@dataclass
class Report:
    """The outcome of every mutant, per alert, and what made the check fail."""

    outcomes: list[Outcome]
    problems: list[str]
    seconds: float

    def by_alert(self) -> dict[str, dict[str, int]]:
        """alert -> status -> count."""
        table: dict[str, dict[str, int]] = {}
        for o in self.outcomes:
            row = table.setdefault(o.mutant.alert, {})
            row[o.status] = row.get(o.status, 0) + 1
        return table

    def case_runs(self) -> int:
        """The promtool test cases run for the mutants (a killed mutant stops at its first failing case)."""
        return sum(o.cases for o in self.outcomes)

    def killed_percent(self) -> float:
        """Killed (by promtool or the structural test) among the valid mutants."""
        valid = [o for o in self.outcomes if o.status != "invalid"]
        killed = [o for o in valid if o.status.startswith("killed")]
        return 100.0 * len(killed) / len(valid) if valid else 100.0


def load_equivalents(path: Path = EQUIVALENTS) -> dict[tuple[str, str, str, str], str]:
    """The listed equivalent mutants: key -> reason."""
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    listed: dict[tuple[str, str, str, str], str] = {}
    for entry in data.get("equivalents") or []:
        key = (str(entry["alert"]), str(entry["operator"]), str(entry["site"]), str(entry["change"]))
        reason = str(entry.get("reason") or "").strip()
        if not reason or key in listed:
            raise ValueError(f"{path.name}: an entry needs one reason and appears once: {key}")
        listed[key] = reason
    return listed


def check(
    alerts: Sequence[str] | None = None, jobs: int = 2, equivalents_path: Path = EQUIVALENTS,
    work_dir: Path | None = None, by_structure: bool = True,
) -> Report:  # fmt: skip
    """Make every mutant of the chosen alerts (all by default), run their tests, and judge the survivors.

    by_structure=False runs the mutants of a family's other members under their own test files too."""
    start = time.monotonic()
    rules = [r for g in load_yaml(RULES)["groups"] for r in g["rules"]]
    kinds = [k.id for k in load_catalog().kinds]
    chosen = [r for r in rules if alerts is None or rule_name(r) in alerts]
    member_of = families(rules) if by_structure else {}
    by_name = {rule_name(r): r for r in rules}
    read_by = readers(rules)
    problems: list[str] = []
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="mutate-alerts-", dir=work_dir) as tmp:
        out = Path(tmp)
        pending: dict[str, tuple[Outcome, dict[str, Any]]] = {}  # test file name -> outcome to fill, its document
        controls: dict[str, str] = {}  # test file name -> alert
        for rule in chosen:
            alert = rule_name(rule)
            # The alerts whose tests judge the rule: itself, or every reader of a record (one per family).
            judges = [alert] if "alert" in rule else list(dict.fromkeys(member_of.get(a, a) for a in read_by[alert]))
            files = [_test_file(a) for a in judges]
            if not files or not all(f.exists() for f in files):
                missing = [str(f.relative_to(ROOT)) for f in files if not f.exists()] or ["no alert reads it"]
                problems.append(f"{alert}: no test file {', '.join(missing)}")
                continue
            family = member_of.get(alert)
            if family is None:
                printed = {**rule, "expr": str(pp.parse(rule["expr"]))}
                for test_file in files:
                    stem = f"control-{alert.lower().replace(':', '-')}-{test_file.name.removesuffix('.test.yaml')}"
                    name, _ = isolate(out, test_file, _replacing(alert, printed), stem)
                    controls[name] = alert
            for n, m in enumerate(mutants(rule, kinds)):
                if family is not None:
                    same = shape(m.rule) == shape(by_name[family])
                    outcomes.append(Outcome(m, "survived" if same else "killed-by-structure", family))
                    continue
                try:
                    pp.parse(m.rule["expr"])
                except Exception:  # the parser raises its own error types
                    outcomes.append(Outcome(m, "invalid", "promql-parser rejects it"))
                    continue
                outcome = Outcome(m, "killed")
                outcomes.append(outcome)
                for test_file in files:
                    stem = f"m{n:03d}-{alert.lower().replace(':', '-')}-{test_file.name.removesuffix('.test.yaml')}"
                    name, test = isolate(out, test_file, _replacing(alert, m.rule), stem)
                    pending[name] = (outcome, test)
        rule_files = [n.replace(".test.yaml", ".rules.yaml") for n in pending]
        checked = _in_batches(["promtool", "check", "rules"], rule_files, out, jobs, "Checking ")
        for name, (outcome, _) in pending.items():
            if name.replace(".test.yaml", ".rules.yaml") not in checked:
                outcome.status, outcome.reason = "invalid", "promtool check rules rejects it"
        # Each valid mutant's cases (of every file that judges it), cheapest first; a mutant is a key while alive.
        cases: dict[int, list[tuple[float, str]]] = {}
        judged: dict[int, Outcome] = {}
        for name, (outcome, test) in pending.items():
            if outcome.status != "invalid":
                cases.setdefault(id(outcome), []).extend(_split_cases(out, name, test))
                judged[id(outcome)] = outcome
        for found in cases.values():
            found.sort()
        failed_controls: set[str] = set()
        first = True
        while cases or first:
            # A round: the next case of every mutant alive (and the controls, whole, in the first round).
            batch = [found[0][1] for found in cases.values()]
            for key in cases:
                judged[key].cases += 1
            passed = _in_batches(["promtool", "test", "rules"], [*(controls if first else ()), *batch], out, jobs,
                                 "Unit Testing:")  # fmt: skip
            if first:
                failed_controls = {alert for name, alert in controls.items() if name not in passed}
                for alert in sorted(failed_controls):
                    problems.append(f"{alert}: its tests fail on the unmutated rule as the parser prints it (control)")
                first = False
            for key, found in list(cases.items()):
                outcome = judged[key]
                if outcome.mutant.alert in failed_controls:
                    outcome.status, outcome.reason = "unjudged", "the control failed"
                    del cases[key]
                elif found[0][1] not in passed:  # killed: its other cases need not run
                    del cases[key]
                else:
                    found.pop(0)
                    if not found:  # every case of every judging file passed
                        outcome.status = "survived"
                        del cases[key]
    listed = load_equivalents(equivalents_path)
    surviving = set()
    for o in outcomes:
        if o.status == "survived":
            surviving.add(o.mutant.key)
            if o.mutant.key in listed:
                o.status, o.reason = "equivalent", listed[o.mutant.key]
            else:
                problems.append(f"new survivor: {_describe(o.mutant)}")
    checked_alerts = {rule_name(r) for r in chosen}
    for key in listed:
        if key[0] in checked_alerts and key not in surviving:
            problems.append(f"stale entry in {equivalents_path.name} (no such surviving mutant): {' | '.join(key)}")
    report = Report(outcomes, problems, time.monotonic() - start)
    if report.killed_percent() < MIN_KILLED_PERCENT:
        problems.append(
            f"only {report.killed_percent():.1f} % of the valid mutants killed (at least {MIN_KILLED_PERCENT:g} %)"
        )
    return report


def _describe(m: Mutant) -> str:
    return f"{m.alert} | {m.operator} | {m.site} | {m.change}"


def suggestions(report: Report) -> str:
    """equivalent-mutants.yaml entries for the unlisted survivors, with a reason to write."""
    entries = [
        {"alert": o.mutant.alert, "operator": o.mutant.operator, "site": o.mutant.site, "change": o.mutant.change,
         "reason": "TODO: why this change cannot alter what the alert does"}
        for o in report.outcomes if o.status == "survived"
    ]  # fmt: skip
    return yaml.safe_dump(entries, sort_keys=False, allow_unicode=True, width=1000) if entries else ""


def summary(report: Report) -> str:
    """The per-alert table, the survivors by alert and operator, and the totals."""
    columns = ("killed", "killed-by-structure", "equivalent", "survived", "invalid", "unjudged")
    heads = ("killed", "by structure", "equivalent", "survived", "invalid", "unjudged")
    table = report.by_alert()
    width = max([30, *(len(a) for a in table)])
    lines = [f"{'rule':{width}} {'mutants':>7} " + " ".join(f"{h:>12}" for h in heads)]
    for alert, row in table.items():
        lines.append(f"{alert:{width}} {sum(row.values()):>7} " + " ".join(f"{row.get(c, 0):>12}" for c in columns))
    total = {c: sum(row.get(c, 0) for row in table.values()) for c in columns}
    lines.append(f"{'all':{width}} {sum(total.values()):>7} " + " ".join(f"{total[c]:>12}" for c in columns))
    survivors = [o for o in report.outcomes if o.status in ("survived", "equivalent")]
    if survivors:
        lines.append("survivors (alert | operator | site | change):")
        lines += [f"  {'listed ' if o.status == 'equivalent' else 'NEW    '}{_describe(o.mutant)}" for o in survivors]
    valid = sum(total.values()) - total["invalid"]
    run = valid - total["killed-by-structure"]
    lines.append(
        f"killed {report.killed_percent():.1f} % of {valid} valid mutants "
        f"(promtool: {total['killed']}/{run} run; structure: {total['killed-by-structure']}); "
        f"{total['equivalent']} equivalent, {total['survived']} unlisted survivors, {total['invalid']} invalid; "
        f"{report.case_runs()} test cases run for the mutants; {report.seconds:.1f} s"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: print the report; exit 1 when the check fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=2, help="promtool processes at a time (default 2)")
    parser.add_argument("--alert", action="append", help="only this alert or recording rule (repeatable)")
    parser.add_argument(
        "--suggest", action="store_true", help="print equivalent-mutants.yaml entries for new survivors"
    )
    parser.add_argument("--json", type=Path, help="also write every mutant's outcome to this file")
    parser.add_argument(
        "--no-structure",
        action="store_true",
        help="run the mutants of every family member under its own test file (slow; informative only)",
    )
    args = parser.parse_args(argv)
    report = check(args.alert, jobs=args.jobs, by_structure=not args.no_structure)
    print(summary(report))
    if args.json:
        rows = [
            {"alert": o.mutant.alert, "operator": o.mutant.operator, "site": o.mutant.site,
             "change": o.mutant.change, "status": o.status, "reason": o.reason}
            for o in report.outcomes
        ]  # fmt: skip
        args.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    if args.suggest and (text := suggestions(report)):
        print("\n# entries for tests/rules/equivalent-mutants.yaml (write each reason):\n" + text)
    for problem in report.problems:
        print(f"FAIL: {problem}", file=sys.stderr)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
