"""The reports of a check (issue 18, items 2 to 4): the text report that scales, JUnit XML with
pytest's structure, heatmaps by failure share with NaN / infinity markers and per-group / per-rank
panels, and the self-contained HTML report, rendered in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden import safetensors as st
from deepgemm_ref.golden.check import describe_bound, format_report
from deepgemm_ref.golden.html import html_report
from deepgemm_ref.golden.junit import junit_xml

CASES = [
    {"id": "dense", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 200, "n": 300, "k": 256},
    {"id": "masked", "kernel": "m_grouped_fp8_gemm_nt_masked", "profile": "sm100", "groups": 3},
    {"id": "c", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 48, "n": 40, "k": 200, "c": "separate"},
    {"id": "moe", "kernel": "fp8_fp4_mega_moe", "profile": "sm100"},
    {"id": "ok", "kernel": "bf16_gemm_nt", "profile": "sm100", "m": 16, "n": 16, "k": 64},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A bundle, its correct outputs and corrupted ones: a zeroed tile and a NaN (dense), one group
    doubled (masked), C missing (c), rank 1 zeroed and a receive count off (moe)."""
    root = tmp_path_factory.mktemp("reports")
    bundle = root / "bundle"
    golden.generate(CASES, bundle)
    good = root / "good.safetensors"
    golden.replay(bundle, good)
    outs = golden.load_outputs(good)
    b = golden.load_bundle(bundle)
    d = outs["dense/d"].copy()
    d[128:200, 128:256] = 0
    d[5, 7] = np.nan
    outs["dense/d"] = d
    m = outs["masked/d"].copy()
    m[1, :20] *= 2
    outs["masked/d"] = m
    case = b.case("c")
    outs["c/d"] = (case.golden()["acc"]).astype(outs["c/d"].dtype)  # C not added
    y = outs["moe/y"].copy()
    y[1, :4] = 0
    outs["moe/y"] = y
    s = outs["moe/stats"].copy()
    s[0, 1] += 3
    outs["moe/stats"] = s
    bad = root / "bad.safetensors"
    st.save_file(outs, bad)
    return bundle, good, bad


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------

def test_passing_outputs_take_one_line_each_or_none_when_quiet(files, capsys):
    bundle, good, _ = files
    reports = golden.check(bundle, good)
    n = len(reports)
    lines = format_report(reports).splitlines()
    assert len(lines) == n + 1 and lines[-1].startswith("summary:")
    assert all(re.match(r"^\S+: PASS  \d+ checked, max normalised error ", line) for line in lines[:-1])
    assert format_report(reports, quiet=True).splitlines() == [lines[-1]]
    assert main(["check", str(bundle), "--outputs", str(good), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "PASS" not in out and "summary:" in out


def test_failure_detail_bounds_as_numbers_and_worst_elements_failures_first(files):
    bundle, _, bad = files
    reports = {r.id: r for r in golden.check(bundle, bad)}
    text = format_report(list(reports.values()))
    assert "{" not in text  # no Python dicts
    dense = reports["dense"]
    assert describe_bound(dense.bound) in text
    assert "E = lambda*sqrt(n)*u_acc*S with lambda 8, n 256, u_acc 2^-24" in text
    assert "E_hard = gamma_n(u_acc)*S" in text
    statuses = [w["status"] for w in dense.worst]
    assert statuses == sorted(statuses, key=("fail", "warn", "pass").index)
    for w in dense.worst:
        assert {"normalised_error", "warn_above", "fail_above"} <= set(w)
        if w["status"] == "fail" and "note" not in w:
            assert w["normalised_error"] > w["fail_above"]
        if w["status"] == "pass":
            assert w["normalised_error"] <= w["fail_above"]
    assert dense.worst[0]["note"] == "NaN / infinity class mismatch"  # an infinite error comes first
    moe = reports["moe/y"]
    assert "S_hard (the case's wider error scale)" in describe_bound(moe.bound)


def test_threshold_columns_agree_with_each_elements_status(files):
    """An element's normalised error is above its own fail threshold exactly when it fails."""
    bundle, good, _ = files
    b = golden.load_bundle(bundle)
    outs = golden.load_outputs(good)
    d = outs["c/d"].copy()
    d.view(np.uint16)[:, :8] += 1  # one bf16 ulp on a few columns
    rep = golden.check_outputs(b, {**outs, "c/d": d}, golden.CheckOptions(worst=40), cases=["c"])[0]
    assert rep.worst
    for w in rep.worst:
        assert (w["normalised_error"] > w["fail_above"]) == (w["status"] == "fail"), w
        assert (w["normalised_error"] > w["warn_above"]) == (w["status"] != "pass"), w


def test_integer_outputs_list_the_differing_entries(files):
    bundle, _, bad = files
    rep = next(r for r in golden.check(bundle, bad) if r.id == "moe/stats")
    text = format_report([rep])
    assert "differing entries" in text and "(0, 1)" in text and "normalised error" not in text
    from deepgemm_ref.golden.plot import can_plot

    assert not can_plot(rep)


# ---------------------------------------------------------------------------------------------
# JUnit
# ---------------------------------------------------------------------------------------------

def _pytest_junit(tmp_path: Path) -> ET.Element:
    test = tmp_path / "test_sample.py"
    test.write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n")
    out = tmp_path / "pytest.xml"
    # plain pytest (no plugin autoloading: neither this package's plugin nor hypothesis' is imported)
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
                    f"--junitxml={out}", "-o", "addopts="], cwd=tmp_path, capture_output=True, timeout=120, env=env)
    return ET.parse(out).getroot()


def test_junit_has_one_test_case_per_output_with_pytest_structure(files, tmp_path):
    bundle, _, bad = files
    reports = golden.check(bundle, bad)
    out = tmp_path / "report.xml"
    assert main(["check", str(bundle), "--outputs", str(bad), "--junit", str(out), "--quiet"]) == 1
    root = ET.parse(out).getroot()
    ref = _pytest_junit(tmp_path)
    assert root.tag == ref.tag == "testsuites"
    [suite] = list(root)
    [ref_suite] = list(ref)
    assert suite.tag == ref_suite.tag == "testsuite"
    assert set(suite.attrib) == set(ref_suite.attrib)
    cases = suite.findall("testcase")
    ref_case = ref_suite.findall("testcase")
    assert set(cases[0].attrib) == set(ref_case[0].attrib)
    assert [c.get("name") for c in cases] == [r.id for r in reports]
    assert int(suite.get("tests")) == len(reports)
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(suite.get("failures")) == len(failed) == sum(r.status == "fail" for r in reports)
    ref_failure = next(c.find("failure") for c in ref_case if c.find("failure") is not None)
    assert set(failed[0].find("failure").attrib) == set(ref_failure.attrib)
    assert cases[0].get("classname") == "bundle.fp8_gemm_nt"
    passing = [c for c in cases if c.get("name") == "ok"]
    assert passing and len(list(passing[0])) == 0


@pytest.mark.slow  # runs the diagnosis of a failing case (seconds): the slow step
def test_junit_marks_unchecked_outputs_as_errors_and_names_the_diagnosis(files, tmp_path):
    bundle, good, bad = files
    outs = golden.load_outputs(bad)
    del outs["ok/d"]
    st.save_file(outs, tmp_path / "partial.safetensors")
    b = golden.load_bundle(bundle)
    reports = golden.check(bundle, tmp_path / "partial.safetensors")
    from deepgemm_ref.golden.diagnose import diagnose_outputs

    diag = diagnose_outputs(b, outs, reports=reports)
    text = junit_xml(reports, cases=b.cases, diagnoses=diag)
    root = ET.fromstring(text)
    errors = root.findall(".//error")
    assert len(errors) == 1 and "missing" in errors[0].get("message")
    assert root.find("testsuite").get("errors") == "1"
    c_case = next(c for c in root.iter("testcase") if c.get("name") == "c")
    assert "explained by c_missing" in c_case.find("failure").get("message")


# ---------------------------------------------------------------------------------------------
# heatmaps
# ---------------------------------------------------------------------------------------------

@pytest.mark.plot
def test_heatmap_colours_by_failure_share_and_marks_nan(files):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    from deepgemm_ref.golden.plot import _figure, heatmap_png

    bundle, _, bad = files
    reports = {r.id: r for r in golden.check(bundle, bad)}
    dense = reports["dense"]
    fig = _figure(dense)
    share_ax, err_ax = fig.axes[0], fig.axes[1]
    share = np.asarray(share_ax.images[0].get_array())
    t = dense.tiles
    # the zeroed 72x128 block is tile (1, 1); its share is its failing count over its checked count
    assert share[1, 1] == pytest.approx(t["failed"][0][1][1] / t["checked"][0][1][1])
    assert share[1, 1] == share.max() and share[0, 2] == 0
    # the NaN tile (0, 0) carries the NaN / infinity marker on both panels; the legend names it
    assert [tuple(p) for p in share_ax.collections[0].get_offsets()] == [(0.0, 0.0)]
    assert err_ax.collections
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "NaN / infinity class mismatch" in labels and "no checked element" in labels
    assert "failing" in share_ax.get_title() and "NaN/inf" in share_ax.get_title()
    assert heatmap_png(dense)[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.plot
def test_heatmap_panels_per_group_and_rank_with_their_own_counts(files):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    import matplotlib.pyplot as plt

    from deepgemm_ref.golden.plot import _figure

    bundle, _, bad = files
    reports = {r.id: r for r in golden.check(bundle, bad)}
    for rid, label in (("masked", "group"), ("moe/y", "rank")):
        rep = reports[rid]
        fig = _figure(rep)
        lead = rep.tiles["shape"][0]
        titles = [ax.get_title() for ax in fig.axes[: 2 * lead: 2]]
        failed = np.asarray(rep.tiles["failed"]).reshape(lead, -1).sum(axis=1)
        checked = np.asarray(rep.tiles["checked"]).reshape(lead, -1).sum(axis=1)
        for g, title in enumerate(titles):
            assert title.startswith(f"{label} {g}: {failed[g]} of {checked[g]} failing"), title
        assert "group" not in " ".join(titles) or label == "group"
        plt.close(fig)


@pytest.mark.plot
def test_plot_skips_integer_outputs(files, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    bundle, _, bad = files
    assert main(["check", str(bundle), "--outputs", str(bad), "--plot", str(tmp_path / "p"), "--quiet"]) == 1
    names = sorted(p.name for p in (tmp_path / "p").rglob("*.png"))
    assert "moe_stats.png" not in names and "moe_y.png" in names and "dense.png" in names


# ---------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------

class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_html_is_self_contained(files):
    bundle, _, bad = files
    b = golden.load_bundle(bundle)
    reports = golden.check(bundle, bad)
    text = html_report(reports, bundle=str(bundle), outputs=str(bad), cases=b.cases)
    p = _Tags()
    p.feed(text)
    assert not [t for t, a in p.tags if t == "link"]
    assert all(not a.get("src") for t, a in p.tags if t == "script")
    assert all((a.get("src") or "").startswith("data:image/png;base64,") for t, a in p.tags if t == "img")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")


def _chromium(args: list[str], url: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory() as profile:
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", *args, url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "HOME": profile})


@pytest.fixture(scope="module")
def html_file(files, tmp_path_factory):
    bundle, _, bad = files
    out = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["check", str(bundle), "--outputs", str(bad), "--html", str(out), "--diagnose", "--quiet"]) == 1
    return out


@pytest.mark.slow  # a real browser takes seconds to start; the HTML itself is checked above
@needs_chromium
def test_html_report_renders_in_chromium(html_file, files):
    bundle, _, bad = files
    reports = golden.check(bundle, bad)
    failing = sum(r.status == "fail" for r in reports)
    res = _chromium(["--virtual-time-budget=10000", "--dump-dom"], html_file.as_uri())
    dom = res.stdout
    assert "<body" in dom, res.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom).group(1)
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body))
    assert attrs["data-ready"] == "1"  # the script ran
    heatmaps = len(re.findall(r'<img class="heatmap"', dom))
    if heatmaps:  # every embedded heatmap decoded
        assert int(attrs["data-images-loaded"]) == heatmaps
    assert int(attrs["data-visible-rows"]) == len(reports)
    assert f"{len(reports)} outputs:" in dom and f"{failing} fail" in dom
    rows = re.findall(r'<tr class="(pass|warn|fail|error)" data-status', dom)
    assert len(rows) == len(reports) and rows.count("fail") == failing
    assert "explained by c_missing" in dom  # the diagnosis
    assert "NaN / infinity class mismatch" in dom and "Worst elements (failures first)" in dom
    # the filter: only failing rows visible
    res = _chromium(["--virtual-time-budget=10000", "--dump-dom"], html_file.as_uri() + "#failures-only")
    body = re.search(r"<body([^>]*)>", res.stdout).group(1)
    assert dict(re.findall(r'([\w-]+)="([^"]*)"', body))["data-visible-rows"] == str(failing)


@pytest.mark.slow  # a real browser takes seconds to start; the HTML itself is checked above
@needs_chromium
def test_html_report_screenshot_shows_the_page(html_file, tmp_path):
    shot = tmp_path / "shot.png"
    _chromium(["--window-size=1200,1600", f"--screenshot={shot}", "--hide-scrollbars"], html_file.as_uri())
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    try:
        import matplotlib.image as mpimg
    except ImportError:
        return
    px = mpimg.imread(shot)[..., :3]
    assert px.std() > 0.05  # not a blank page
    red = (px[..., 0] > 0.6) & (px[..., 1] < 0.25) & (px[..., 2] < 0.3)
    assert np.count_nonzero(red) > 50  # the FAIL markers and status colour are drawn


def test_html_without_matplotlib_draws_the_tiles_as_a_table(files, monkeypatch):
    from deepgemm_ref.errors import DGArgumentError
    from deepgemm_ref.golden import plot

    def missing() -> None:
        raise DGArgumentError("heatmaps need matplotlib")

    monkeypatch.setattr(plot, "_matplotlib", missing)
    bundle, _, bad = files
    b = golden.load_bundle(bundle)
    text = html_report(golden.check(bundle, bad), cases=b.cases)
    assert '<table class="tiles">' in text and "<img" not in text
    assert "matplotlib is not installed" in text and "&#x2716;" in text  # the NaN tile is marked
