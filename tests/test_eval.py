"""The labelled evaluation set (tests/eval/, traceanalyzer/eval.py): every label is well formed
(without ../shared too), the harness can fail, and with ../shared every label's required
expectations are met and no must_not is hit, on the corpus store the suite builds once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from traceanalyzer import eval as ev
from traceanalyzer.store import Store

from .conftest import FIXTURES, ROOT, shared_traces

LABELS = ROOT / "tests" / "eval" / "labels"


def test_every_label_is_well_formed():
    labels = ev.load_labels(LABELS)  # raises LabelError, naming the file, on the first bad one
    assert len(labels) >= 25
    for lb in labels:
        kind, _, file_name = lb.trace.partition("/")
        # the label's path mirrors its trace's: <kind>/<trace file name without its extensions>
        assert lb.name.split("/")[0] == kind, lb.path
        assert file_name.startswith(lb.path.stem) and file_name[len(lb.path.stem):][:1] in ("", ".", "/"), lb.path
        assert lb.derived.strip() and lb.summary.strip(), lb.path
        assert lb.input_error or lb.expect or lb.budget or lb.must_not, lb.path


def test_labels_name_traces_that_exist():
    traces = shared_traces()
    missing = [lb.name for lb in ev.load_labels(LABELS) if not (traces / lb.trace).exists()]
    assert not missing, f"labels whose trace is not in ../shared/traces: {missing}"


def test_a_trace_is_labelled_once(tmp_path):
    labels = tmp_path / "labels"
    _write(labels, "nsys/a.toml", GOOD + "[[must_not]]\nrule = 'T004'\nwhy = 'w'\n")
    _write(labels, "nsys/b.toml", GOOD + "[[must_not]]\nrule = 'T004'\nwhy = 'w'\n")
    with pytest.raises(ev.LabelError, match="labels 'nsys/planted.sqlite' again"):
        ev.load_labels(labels)


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


GOOD = '''trace = "nsys/planted.sqlite"
summary = "s"
derived = "d"
'''


@pytest.mark.parametrize("body, says", [
    ("trace = 'nsys/planted.sqlite'\nsummary = 's'\n[[expect]]\nrule='T002'\nrequired=true\nwhy='w'\n", "derived"),
    (GOOD + "[[expect]]\nrule = 'X999'\nrequired = true\nwhy = 'w'\n", "unknown rule id 'X999'"),
    (GOOD + "[[expect]]\nrule = 'T002'\nwhy = 'w'\n", "required must be true or false"),
    (GOOD + "[[expect]]\nrule = 'T002'\nrequired = true\n", "why must be"),
    (GOOD + "[[expect]]\nrule = 'T002'\nrequired = true\nwhy = 'w'\nclaim = 'copy'\n", "unknown key(s) claim"),
    (GOOD + "[[expect]]\nrule = 'T002'\nrequired = true\nwhy = 'w'\nclaims = 'idle:cpu'\n", "no budget part"),
    (GOOD + "[[budget]]\npart = 'gpu'\nshare = [0.1, 0.2]\nrequired = true\nwhy = 'w'\n", "no budget part"),
    (GOOD + "[[budget]]\npart = 'copy'\nshare = [0.3, 0.2]\nrequired = true\nwhy = 'w'\n", "low <= high"),
    (GOOD + "[[expect]]\nrule = 'T002'\nrequired = true\nwhy = 'w'\nseverity = 'bad'\n", "severity"),
    (GOOD + "[[must_not]]\nrules = []\nwhy = 'w'\n", "rules"),
    (GOOD, "expects nothing"),
    (GOOD + "[[expect]\n", "not valid TOML"),
])
def test_a_malformed_label_is_one_line_naming_the_file(tmp_path, capsys, body, says):
    path = _write(tmp_path / "labels", "nsys/planted.toml", body)
    with pytest.raises(ev.LabelError) as e:
        ev.load_label(path)
    assert str(path) in str(e.value) and says in str(e.value) and "\n" not in str(e.value)
    assert ev.main(["--labels", str(tmp_path / "labels"), "--traces", str(FIXTURES)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(path) in err and "\n" not in err


PLANTED = '''trace = "nsys/planted.sqlite"
summary = "the planted nsys fixture (fixtures/gen_nsys.py)"
derived = "fixtures/gen_nsys.py PLANTED: 22 host-to-device copies with no kernel beside them"
'''


def test_the_harness_scores_and_can_fail(tmp_path, capsys):
    labels, store = tmp_path / "labels", tmp_path / "s.duckdb"
    _write(labels, "nsys/planted.toml", PLANTED + '''
[[expect]]
rule = "T002"
claims = "copy:HtoD"
headline = true
severity = "error"
required = true
why = "the planted unhidden copies"

[[budget]]
part = "copy"
share = [0.3, 0.5]
required = true
why = "copies are 39% of the span"

[[expect]]
rule = "T004"
required = false
why = "informational, not there"

[[must_not]]
rule = "B001"
severity = ["warning", "error"]
why = "the planted tail kernel is tiny"
''')
    argv = ["--labels", str(labels), "--traces", str(FIXTURES), "--store", str(store)]
    assert ev.main(argv) == 0
    out = capsys.readouterr().out
    assert "nsys/planted" in out and "2/2" in out and "0/1" in out and "PASS" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    # an impossible required expectation fails the run, and says which
    impossible = _write(labels, "nsys/planted.toml", PLANTED + '''
[[expect]]
rule = "T002"
loss_ms = [1000.0, 2000.0]
required = true
why = "impossible: the whole span is 0.4 ms"
''')
    assert ev.main(argv) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "unmet: T002 loss 1000-2000 ms" in out
    # so does a must_not that is hit (the store is reused: nothing is read again)
    impossible.write_text(PLANTED + '''
[[must_not]]
rule = "T002"
why = "it is there"
''')
    assert ev.main([*argv, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["must_not_hits"] == 1 and not doc["totals"]["ok"]
    assert doc["labels"][0]["outcomes"][0]["seen"].startswith("T002 error")
    # an informational must_not that is hit is counted, and fails nothing
    impossible.write_text(PLANTED + '''
[[must_not]]
rule = "T002"
required = false
why = "it is there"
''')
    assert ev.main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["informational_must_not_hits"] == 1


def test_an_expected_input_error(tmp_path, capsys):
    traces = tmp_path / "traces"
    _write(traces, "ncu/failed.ncu.csv", "==PROF== Connected to process 1\n==ERROR== The application returned an error code (1).\n")
    shutil.copyfile(FIXTURES / "nsys" / "planted.sqlite", traces / "planted.sqlite")
    labels = tmp_path / "labels"
    _write(labels, "ncu/failed.toml", '''trace = "ncu/failed.ncu.csv"
summary = "a failed profile"
derived = "only ==PROF== lines and an ==ERROR== line"
input_error = "no ncu CSV header"
''')
    assert ev.main(["--labels", str(labels), "--traces", str(traces)]) == 0
    assert "1/1" in capsys.readouterr().out
    _write(labels, "ncu/failed.toml", '''trace = "ncu/failed.ncu.csv"
summary = "a failed profile"
derived = "d"
input_error = "something else"
''')
    assert ev.main(["--labels", str(labels), "--traces", str(traces)]) == 1
    assert "unmet: input error: something else" in capsys.readouterr().out


def test_every_label_holds_on_the_real_corpus(real_corpus, tmp_path):
    """The whole evaluation set, on the corpus store the suite builds once (tests/conftest.py);
    what that store lacks (a folder trace, a file that is no profile) is checked into a scratch
    store."""
    labels = ev.load_labels(LABELS)
    with Store(tmp_path / "scratch.duckdb") as scratch:
        scores = ev.evaluate(labels, shared_traces(), real_corpus, scratch)
    failures = [f"{s.label.name}: {'hit' if o.section == 'must_not' else 'unmet'}: {o.what} (seen: {o.seen})"
                for s in scores for o in s.failures()]
    assert not failures, "\n".join(failures)
    totals = ev.totals(scores)
    assert totals["required"][1] >= 50 and totals["labels"] == len(labels)
    print(ev.table(scores))
