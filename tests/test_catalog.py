"""The catalog's own examples, its ordering rule, and the loader's refusals."""

from __future__ import annotations

import ast
import dataclasses
import os
import textwrap

import pytest
import yaml

from sglang_oom_exporter.catalog import CatalogError, default_catalog_path, load_catalog
from sglang_oom_exporter.catalog.vocabulary import EVENT_FIELDS
from sglang_oom_exporter.detect.match import Matcher
from tests.support.helpers import scan_text
from tests.support.logs import scheduler_crash

CATALOG = load_catalog()
MATCHER = Matcher(CATALOG)

MATCH_CASES = [(k.id, line) for k in CATALOG.kinds for line in k.match_examples]
NO_MATCH_CASES = [(k.id, line) for k in CATALOG.kinds for line in k.no_match_examples]

PUBLIC_IDS = ("prefill", "decode", "req_slots", "unknown", "cuda_oom", "startup", "mamba", "memory_leak", "retract")


def test_public_kind_ids_are_all_present():
    assert set(PUBLIC_IDS) <= set(CATALOG.ids)
    assert CATALOG.ids[:3] == ("prefill", "decode", "req_slots")


@pytest.mark.parametrize(("kind", "line"), MATCH_CASES)
def test_match_example_is_claimed_by_its_own_kind(kind, line):
    found = MATCHER.match_line(line)
    assert found is not None, line
    assert found[0].id == kind


def _alone(kind: str) -> Matcher:
    """A matcher over this one kind, so no earlier kind can hide what its own patterns do."""
    return Matcher(dataclasses.replace(CATALOG, kinds=(CATALOG.kind(kind),)))


@pytest.mark.parametrize(("kind", "line"), NO_MATCH_CASES)
def test_no_match_example_is_not_its_kind(kind, line):
    assert _alone(kind).match_line(line) is None


@pytest.mark.parametrize(("kind", "line"), MATCH_CASES)
def test_each_pattern_needs_its_anchor(kind, line):
    # The prefilter only looks near anchors: a pattern that matched without one would be invisible to it.
    # Regex-level check (the matcher's own anchor test is bypassed): strip every anchor, no pattern may match.
    stripped = line
    for anchor in CATALOG.kind(kind).anchors:
        stripped = stripped.replace(anchor, "")
    assert any(p.regex.search(line) for p in CATALOG.kind(kind).patterns)
    assert [p.regex.pattern for p in CATALOG.kind(kind).patterns if p.regex.search(stripped)] == []


def test_every_kind_has_remediation_steps_with_flags_and_a_runbook():
    for kind in CATALOG.kinds:
        assert kind.summary.endswith("."), kind.id
        assert kind.steps, kind.id
        assert {"meaning", "impact"} <= set(kind.runbook), kind.id
        assert kind.remediation()["runbook_anchor"] == kind.id


def _write(tmp_path, text):
    path = tmp_path / "catalog.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _shipped():
    with open(default_catalog_path()) as fh:
        return yaml.safe_load(fh)


def test_loader_reports_every_problem_with_file_and_line(tmp_path):
    data = _shipped()
    data["kinds"][6]["id"] = "mamba"  # duplicate (cuda_oom is referenced nowhere else)
    data["kinds"][2]["colour"] = "red"  # unknown key
    data["kinds"][3]["patterns"][0]["regex"] = "(?P<favourite_number>\\d+)"  # not an event field
    del data["kinds"][4]["examples"]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CatalogError) as err:
        load_catalog(str(path))
    problems = err.value.problems
    assert len(problems) == 4, problems
    assert all(p.startswith(f"{path}:") for p in problems)
    text = "\n".join(problems)
    assert "duplicate id 'mamba'" in text
    assert "colour: unknown key" in text
    assert "favourite_number" in text
    assert "needs match and no_match" in text or "examples: missing" in text
    # line numbers point into the file, not at "?"
    assert all(p.split(":")[1].isdigit() for p in problems)


def test_the_crash_rules_are_checked_like_the_rest(tmp_path):
    data = _shipped()
    data["crash"]["id"] = "prefill"  # a kind's id: the crash would count as that OOM kind
    del data["crash"]["alert"]["loop"]
    data["crash_exceptions"] = ["ValueError", "not a class"]
    data["crash_frames"]["launched"] = ["main"]
    data["startup_kind"] = "boot"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CatalogError) as err:
        load_catalog(str(path))
    text = "\n".join(err.value.problems)
    assert len(err.value.problems) == 5, text
    assert "crash.id: 'prefill' is also a kind" in text
    assert "crash.alert.loop: needs severity, count and window" in text
    assert "crash_exceptions: must be a list of exception class names" in text
    assert "crash_frames.launched: unknown group (use memory, init, launch)" in text
    assert "startup_kind: names unknown kind 'boot'" in text


def test_the_crash_entry_is_no_kind_and_its_examples_classify_as_it():
    crash = CATALOG.crash
    assert crash is not None
    assert crash.id not in CATALOG.ids
    assert CATALOG.kind(crash.id) is crash
    assert CATALOG.is_crash(crash.id)
    assert not any(CATALOG.is_crash(k) for k in CATALOG.ids)
    assert CATALOG.event_ids == (*CATALOG.ids, crash.id)
    for line in crash.match_examples:  # raised under an allocator frame, the text still makes it the crash
        log = scheduler_crash(line, [("mem_cache/allocation.py", "alloc_token_slots")])
        assert [e.kind for e in scan_text(log)] == [crash.id], line
    for line in crash.no_match_examples:
        assert not any(p.regex.search(line) for p in crash.patterns), line


def test_loader_rejects_bad_yaml_with_its_line(tmp_path):
    path = _write(tmp_path, "version: 1\nkinds: [\n  - id: x\n")
    with pytest.raises(CatalogError) as err:
        load_catalog(path)
    assert err.value.problems[0].startswith(f"{path}:")
    assert "not valid YAML" in err.value.problems[0]


@pytest.mark.parametrize("joins", ["Two Words", 3, ""])
def test_loader_rejects_a_joins_name_that_is_not_snake_case(tmp_path, joins):
    data = _shipped()
    data["kinds"][0]["patterns"][0]["joins"] = joins
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CatalogError, match="joins: must be a snake_case name"):
        load_catalog(str(path))


def test_loader_rejects_a_missing_file(tmp_path):
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(str(tmp_path / "absent.yaml"))


def test_loader_rejects_a_bad_regex(tmp_path):
    data = _shipped()
    data["kinds"][0]["patterns"][0]["regex"] = "Prefill (out of memory"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CatalogError, match="bad regex"):
        load_catalog(str(path))


@pytest.mark.parametrize("frames", ["prefill_cuda_graph_runner.py:capture", [":"], [3]])
def test_loader_rejects_pattern_frames_that_are_not_a_list_of_frames(tmp_path, frames):
    data = _shipped()
    data["kinds"][0]["patterns"][0]["frames"] = frames
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CatalogError) as err:
        load_catalog(str(path))
    assert len(err.value.problems) == 1, err.value.problems
    assert "patterns[0].frames: must be a list of" in err.value.problems[0]


def test_a_pattern_with_frames_matches_only_under_one_of_them():
    # The start-up capture pattern (0.5.23's prefill CUDA graph) claims torch's text only under its capture frames:
    # the bare line and the same text at run time (a replay) stay the CUDA allocator's kind.
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB."
    capture = [("/x/sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py", "capture")]
    replay = [("/x/sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py", "replay")]
    wrong_file = [("/x/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py", "capture")]
    foreign = [("/x/vllm/worker/prefill_cuda_graph_runner.py", "capture")]  # another program's file of that name
    found = {name: MATCHER.match_line(line, frames=frames) for name, frames in
             (("none", ()), ("capture", capture), ("replay", replay), ("wrong_file", wrong_file), ("foreign", foreign))}  # fmt: skip
    assert {name: f[0].id if f else None for name, f in found.items()} == {
        "none": "cuda_oom", "capture": "startup", "replay": "cuda_oom", "wrong_file": "cuda_oom", "foreign": "cuda_oom"}  # fmt: skip
    assert found["capture"][1].suggest == "none"  # type: ignore[index]


@pytest.mark.parametrize(
    ("phase_kinds", "problem"),
    [
        ({"prefill": "prefill", "decode": "decode", "spec_verify": "decode"}, "must map each of prefill, decode"),
        ({"prefill": "prefill"}, "must map each of prefill, decode"),
        (
            {"prefill": "prefill", "decode": "decode", "pd_decode_prealloc": "no_such_kind"},
            "phase_kinds.pd_decode_prealloc",
        ),
    ],
)
def test_phase_kinds_map_the_kv_phases_and_may_map_only_the_pd_prealloc_group(tmp_path, phase_kinds, problem):
    data = _shipped()
    assert data["phase_kinds"] == {"prefill": "prefill", "decode": "decode", "pd_decode_prealloc": "pd_prealloc"}
    data["phase_kinds"] = phase_kinds
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CatalogError) as err:
        load_catalog(str(path))
    assert len(err.value.problems) == 1, err.value.problems
    assert problem in err.value.problems[0]


def test_a_catalog_may_leave_the_pd_prealloc_group_out_of_phase_kinds(tmp_path):
    data = _shipped()
    data["phase_kinds"] = {"prefill": "prefill", "decode": "decode"}
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_catalog(str(path)).phase_kinds == {"prefill": "prefill", "decode": "decode"}
    assert CATALOG.phase_kinds["pd_decode_prealloc"] == "pd_prealloc"


def test_event_fields_cover_every_named_group():
    for kind in CATALOG.kinds:
        for pattern in kind.patterns:
            assert set(pattern.regex.groupindex) <= EVENT_FIELDS


def _rendered_scalars():
    """(where, node) for every scalar the catalog renders for humans: titles, remediation, runbook prose."""
    with open(default_catalog_path()) as fh:
        root = yaml.compose(fh)
    kinds = next(v for k, v in root.value if k.value == "kinds")
    out = []

    def walk(node, where):
        if isinstance(node, yaml.ScalarNode):
            out.append((where, node))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{where}[{i}]")
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(value, f"{where}.{key.value}")

    for kind in kinds.value:
        fields = {k.value: v for k, v in kind.value}
        for key in ("title", "remediation", "runbook"):
            if key in fields:
                walk(fields[key], f"{fields['id'].value}.{key}")
    return out


def test_no_remediation_text_is_cut_at_a_yaml_comment():
    # An unquoted " #running-req" is a YAML comment: the text ended there. Prose must never be followed by
    # a comment on its line, so a cut is impossible to miss.
    with open(default_catalog_path()) as fh:
        lines = fh.read().splitlines()
    scalars = _rendered_scalars()
    assert len(scalars) > 50
    for where, node in scalars:
        end = node.end_mark
        rest = lines[end.line][end.column :] if end.line < len(lines) else ""
        assert not rest.lstrip().startswith("#"), f"{where} is cut by a comment: {node.value!r} {rest.strip()!r}"


def test_no_remediation_text_ends_mid_sentence():
    dangling = {"the", "a", "an", "to", "of", "for", "and", "or", "with", "at", "by", "in", "as", "than", "if"}
    for where, node in _rendered_scalars():
        text = node.value.strip()
        assert text, where
        if ".summary" in where or ".runbook." in where:
            # Sentences: a summary and the runbook prose end with a full stop or a closing bracket.
            assert text.endswith((".", ")")), f"{where} ends mid-sentence: {text!r}"
        else:
            # Titles and step fields are phrases, but never cut after a function word.
            assert text.split()[-1].lower() not in dangling, f"{where} ends mid-phrase: {text!r}"


def test_the_decode_fix_keeps_its_running_req_hint():
    step = CATALOG.kind("decode").remediation()["steps"][0]
    assert step["action"] == "lower it, for example to the #running-req seen just before the failure"


def _package_modules() -> list[str]:
    package = os.path.dirname(os.path.dirname(default_catalog_path()))
    return sorted(os.path.join(d, n) for d, _dirs, files in os.walk(package) for n in files if n.endswith(".py"))


def _spellings(text: str) -> list[str]:
    return [k for k in CATALOG.ids for quoted in (f'"{k}"', f"'{k}'") for _ in range(text.count(quoted))]


def _vocabulary_path() -> str:
    from sglang_oom_exporter.catalog import vocabulary

    return os.path.realpath(vocabulary.__file__)


def test_no_python_module_names_a_kind():
    # The catalog is the only home of a kind: no module spells any kind id, whatever else the word means there,
    # with one exception, catalog/vocabulary.py, where a phase may share its name with a kind (prefill, decode);
    # the next test holds it to that, and the one after to its constants not being used as kinds.
    found = [
        (os.path.basename(path), kid)
        for path in _package_modules()
        if os.path.realpath(path) != _vocabulary_path()
        for kid in _spellings(open(path, encoding="utf-8").read())
    ]
    assert found == []


def test_the_vocabulary_spells_a_kind_id_only_as_a_phase_the_catalog_uses_or_a_pool_sglang_names():
    from sglang_oom_exporter.catalog import vocabulary

    with open(_vocabulary_path(), encoding="utf-8") as fh:
        text = fh.read()
    constants = {
        node.targets[0].id: node.value.value
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and node.value.value in CATALOG.ids
    }
    # Every spelling is the whole value of one such NAME = "id" line: none in a tuple, a dict, a comment or text.
    assert sorted(_spellings(text)) == sorted(constants.values())
    assert sorted(constants) == ["PHASE_DECODE", "PHASE_PREFILL", "POOL_MAMBA"]
    # ... and each is a phase the catalog itself uses: a kind's phase, a phase_kinds key and a phase_frames group;
    # or the name detection gives a pool SGLang's own message names ("Available mamba: N", facts 2).
    for name, value in constants.items():
        assert getattr(vocabulary, name) == value
        if name.startswith("POOL_"):
            block = ("Out of memory. Try to lower your batch size.\nTry to allocate 8 tokens.\n"
                     f"Available {value}: 5 (available_size=5 + component_evictable_size_=0)\n\n")  # fmt: skip
            assert [p.name for e in scan_text(block) for p in e.pools] == [value]
            continue
        assert value in vocabulary.PHASES
        assert value in {k.phase for k in CATALOG.kinds}
        assert value in CATALOG.phase_kinds
        assert value in CATALOG.phase_frames


def _names_a_kind(node: ast.expr) -> bool:
    """An expression that holds a kind id: `x.kind`, `x.id`, `kind`, `kind_id`."""
    return (isinstance(node, ast.Attribute) and node.attr in {"kind", "id"}) or (
        isinstance(node, ast.Name) and node.id in {"kind", "kind_id"}
    )


def test_no_module_uses_a_phase_that_shares_a_kind_id_as_that_kind():
    # The phase constants of the vocabulary that are also kind ids (and the collections holding them) are
    # phases: a module that looks a kind up by one, or compares a kind with one, names a kind in disguise.
    from sglang_oom_exporter.catalog import vocabulary

    def holds_a_kind_id(value: object) -> bool:
        if isinstance(value, str):
            return value in CATALOG.ids
        if isinstance(value, (tuple, list, frozenset, set)):
            return any(holds_a_kind_id(v) for v in value)
        if isinstance(value, dict):
            return any(holds_a_kind_id(v) for v in (*value, *value.values()))
        return False

    disguised = {name for name in dir(vocabulary) if name.isupper() and holds_a_kind_id(getattr(vocabulary, name))}
    assert {"PHASE_PREFILL", "PHASE_DECODE", "KV_PHASES"} <= disguised

    def is_disguised(node: ast.expr) -> bool:
        return any(isinstance(n, ast.Name) and n.id in disguised for n in ast.walk(node))

    found = []
    for path in _package_modules():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "kind":
                found += [(os.path.basename(path), node.lineno) for a in node.args if is_disguised(a)]
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(_names_a_kind(s) for s in sides) and any(is_disguised(s) for s in sides):
                    found.append((os.path.basename(path), node.lineno))
    assert found == []


def test_every_event_field_has_a_known_type():
    from sglang_oom_exporter.catalog.vocabulary import FIELD_KINDS, FIELD_TYPES

    assert set(FIELD_TYPES.values()) <= set(FIELD_KINDS)
    assert frozenset(FIELD_TYPES) == EVENT_FIELDS
