"""Bundles confined to their directory, manifests validated field by field (issue 14, item 2), and
a fuzz test: no forged manifest makes replay / check / verify show a traceback (item 5)."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from deepgemm_ref import golden
from deepgemm_ref.cli import main
from deepgemm_ref.golden.bundle import manifest_digest

SMALL = [
    {"id": "g", "kernel": "fp8_gemm_nt", "profile": "sm100", "m": 16, "n": 32, "k": 128},
    {"id": "grp", "kernel": "m_grouped_fp8_gemm_nt_contiguous", "profile": "sm100", "groups": 2, "m": 8, "n": 16,
     "k": 128},
    {"id": "pmqa", "kernel": "fp8_fp4_paged_mqa_logits", "profile": "sm100", "batch": 2},
    {"id": "moe", "kernel": "bf16_mega_moe", "profile": "sm100", "ranks": 1, "experts": 2, "topk": 1,
     "hidden": 128, "intermediate": 128, "tokens": 4},
    {"id": "hc", "kernel": "tf32_hc_prenorm_gemm", "profile": "sm100", "m": 4, "n": 8, "k": 64},
]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("small") / "b"
    golden.generate(SMALL, root)
    outs = root.parent / "outs.safetensors"
    golden.replay(root, outs)
    return root, outs


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _rewrite(root, edit, rehash=True):
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    if rehash:
        m["manifest_sha256"] = manifest_digest(m)
    (root / "manifest.json").write_text(json.dumps(m))
    return m


def _all_refuse(root, outs, tmp_path, capsys, *words):
    for argv in (["replay", str(root), "--out", str(tmp_path / "o.safetensors"), "--force"],
                 ["check", str(root), "--outputs", str(outs)], ["verify", str(root)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and "internal error" not in err
        for w in words:
            assert w in err, (w, err)


@pytest.mark.parametrize("path", ["../outside/x.safetensors", "/etc/passwd", "cases/../../x.safetensors",
                                  "cases/grp.safetensors", "manifest.json"])
def test_a_forged_file_path_is_refused(small, tmp_path, capsys, path):
    root, outs = small
    copy_ = _copy(root, tmp_path / "b")
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(root / "cases" / "g.safetensors", outside / "x.safetensors")
    _rewrite(copy_, lambda m: m["cases"][0].update(file=path))
    _all_refuse(copy_, outs, tmp_path, capsys, "'g'", "file")


def test_symlinked_case_file_and_cases_directory_are_refused(small, tmp_path, capsys):
    root, outs = small
    copy_ = _copy(root, tmp_path / "b")
    target = tmp_path / "elsewhere.safetensors"
    shutil.copy(copy_ / "cases" / "g.safetensors", target)
    (copy_ / "cases" / "g.safetensors").unlink()
    (copy_ / "cases" / "g.safetensors").symlink_to(target)
    with pytest.raises(golden.BundleError, match="symlink"):
        golden.load_bundle(copy_).case("g")
    assert main(["check", str(copy_), "--outputs", str(outs)]) == 2
    assert "symlink" in capsys.readouterr().err
    copy2 = _copy(root, tmp_path / "b2")
    shutil.move(copy2 / "cases", tmp_path / "real-cases")
    (copy2 / "cases").symlink_to(tmp_path / "real-cases")
    with pytest.raises(golden.BundleError, match="symlink"):
        golden.load_bundle(copy2).case("g")
    copy3 = _copy(root, tmp_path / "b3")
    shutil.move(copy3 / "manifest.json", tmp_path / "m.json")
    (copy3 / "manifest.json").symlink_to(tmp_path / "m.json")
    with pytest.raises(golden.BundleError, match="symlink"):
        golden.load_bundle(copy3)


@pytest.mark.parametrize("function", ["set_num_sms", "get_num_sms", "__import__", "transform_sf_into_required_layout",
                                      "bf16_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous"])
def test_function_must_be_a_kernel_of_the_family(small, tmp_path, capsys, function):
    root, outs = small
    copy_ = _copy(root, tmp_path / "b")
    _rewrite(copy_, lambda m: m["cases"][0].update(function=function))
    if function == "bf16_gemm_nt":  # a kernel of the same family: accepted by the format, refused by the kernel
        assert main(["replay", str(copy_), "--out", str(tmp_path / "o.safetensors")]) == 1
        cap = capsys.readouterr()
        # the case fails, recorded with the kernel's refusal of the fp8 call (no crash, no traceback)
        assert "deepgemm-ref: replay: case 'g' failed: " in cap.err and "bf16_gemm_nt" in cap.err, cap.err
        assert "Traceback" not in cap.err and "internal error" not in cap.err, cap.err
        assert "; 1 case failed" in cap.out, cap.out
        return
    _all_refuse(copy_, outs, tmp_path, capsys, "function")


def test_setup_derived_transform_and_driver_functions_are_checked(small, tmp_path, capsys):
    root, outs = small
    edits = {
        "setup": lambda m: m["cases"][1]["setup"].append({"function": "set_num_sms", "args": [{"value": 1}]}),
        "derived": lambda m: m["cases"][2]["derived"].append({"name": "x", "function": "set_arch",
                                                              "args": [{"value": "sm90"}]}),
        "transform": lambda m: m["cases"][0]["transforms"]["a_sf"].update(function="set_num_sms"),
        "driver": lambda m: m["cases"][3]["driver"].update(name="evil"),
        "driver_on_gemm": lambda m: m["cases"][0].update(driver={"name": "mega_moe"}),
    }
    for name, edit in edits.items():
        copy_ = _copy(root, tmp_path / name)
        _rewrite(copy_, edit)
        _all_refuse(copy_, outs, tmp_path, capsys)


def test_forged_sizes_are_refused_before_allocation(small, tmp_path, capsys):
    root, outs = small
    edits = {
        "output shape": lambda m: m["cases"][0]["outputs"]["d"].update(shape=[10**6, 10**6]),
        "golden shape too": lambda m: (m["cases"][0]["outputs"]["d"].update(shape=[10**6, 10**6]),
                                       m["cases"][0]["tensors"]["golden.d"].update(shape=[10**6, 10**6])),
        "recipe value": lambda m: m["cases"][0]["kwargs"].update(recipe={"value": [1, 1, 10**12]}),
        "mqa max_context_len": lambda m: m["cases"][2]["args"].__setitem__(-1, {"value": 10**6}),
        "mqa block_kv": lambda m: m["cases"][2]["derived"][1]["args"].__setitem__(1, {"value": 10**9}),
        "moe experts": lambda m: m["cases"][3]["driver"].update(experts=10**6),
        "moe experts within the bound": lambda m: m["cases"][3]["driver"].update(experts=512),
        "moe tokens": lambda m: m["cases"][3]["driver"].update(tokens=100),
        "transform mn": lambda m: m["cases"][0]["transforms"]["a_sf"]["kwargs"].update(mn=10**9),
    }
    for name, edit in edits.items():
        copy_ = _copy(root, tmp_path / name.replace(" ", "-"))
        _rewrite(copy_, edit)
        _all_refuse(copy_, outs, tmp_path, capsys)


@pytest.mark.parametrize("field,value,words", [
    (("cases",), {}, ("'cases'", "a list")),
    (("cases", 0, "seed"), -1, ("'cases[0].seed'",)),
    (("cases", 0, "seed"), True, ("'cases[0].seed'",)),
    (("cases", 0, "check", "n"), 0, ("check.n",)),
    (("cases", 0, "check", "n"), "256", ("check.n",)),
    (("cases", 0, "check", "u_acc"), 5.0, ("u_acc",)),
    (("cases", 0, "check", "epilogue", "out"), "f16", ("epilogue.out",)),
    (("cases", 0, "check", "epilogue", "c"), "nope", ("epilogue.c",)),
    (("cases", 0, "outputs", "d", "dtype"), "float16", ("outputs.d.dtype",)),
    (("cases", 0, "outputs", "d", "shape"), [-1, 2], ("outputs.d.shape",)),
    (("cases", 0, "outputs", "d", "init"), "garbage", ("outputs.d.init",)),
    (("cases", 0, "args"), "x", ("'cases[0].args'",)),
    (("cases", 0, "args", 0), {"tensor": "missing"}, ("args[0]",)),
    (("cases", 0, "args", 0), {"value": {"a": 1}}, ("args[0]",)),
    (("cases", 0, "tensors", "golden.d", "dtype"), "F99", ("golden.d.dtype",)),
    (("cases", 0, "file_sha256"), "zz", ("file_sha256",)),
    (("cases", 0, "profile"), "sm101", ("profile",)),
    (("cases", 0, "kernel"), "no_such_kernel", ("kernel",)),
    (("cases", 0, "main_output"), "q", ("main_output",)),
    (("cases", 0, "returns"), "d", ("returns",)),
    (("version",), "2", ("version",)),
    (("incomplete",), "g", ("incomplete",)),
    (("extra_field",), 1, ("only the fields",)),
])
def test_manifest_fields_are_validated_by_type(small, tmp_path, capsys, field, value, words):
    root, outs = small
    copy_ = _copy(root, tmp_path / "b")

    def edit(m):
        node = m
        for k in field[:-1]:
            node = node[k]
        node[field[-1]] = value

    _rewrite(copy_, edit)
    _all_refuse(copy_, outs, tmp_path, capsys, *words)


def test_colliding_ids_are_refused_before_anything_is_written(tmp_path, capsys):
    base = {"kernel": "bf16_gemm_nt", "profile": "sm100", "m": 16, "n": 16, "k": 32}
    for ids in (("x/y", "x_y"), ("Case", "case"), ("a b", "a_b")):
        out = tmp_path / ids[0].replace("/", "-").replace(" ", "-")
        with pytest.raises(golden.BundleError, match="one file name"):
            golden.generate([dict(base, id=ids[0]), dict(base, id=ids[1])], out)
        assert not out.exists()
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps([dict(base, id="x/y"), dict(base, id="x_y")]))
    out = tmp_path / "cli"
    out.mkdir()
    golden.generate([dict(base, id="keep")], out)
    before = sorted(p.name for p in (out / "cases").iterdir())
    assert main(["golden", "--spec", str(spec), "--out", str(out), "--force"]) == 2
    assert "'x/y' and 'x_y'" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "cases").iterdir()) == before and golden.verify(out)["ok"]


def test_unedited_bundle_passes_every_command(small, tmp_path, capsys):
    root, outs = small
    assert main(["verify", str(root)]) == 0
    assert main(["check", str(root), "--outputs", str(outs)]) == 0
    assert main(["replay", str(root), "--out", str(tmp_path / "o.safetensors")]) == 0


# ---------------------------------------------------------------------------------------------
# fuzz: forged manifests never give a traceback
# ---------------------------------------------------------------------------------------------

_json = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(-2**70, 2**70) | hs.sampled_from([0, 1, -1, 2**31, 2**63, 10**12])
    | hs.floats(allow_nan=False, allow_infinity=False) | hs.text(max_size=12)
    | hs.sampled_from(["cases/g.safetensors", "../x", "/etc/passwd", "set_num_sms", "fp8_gemm_nt", "bfloat16",
                       "zeros", "returned", "d", "a", "mega_moe", "F32", "sm90"]),
    lambda children: hs.lists(children, max_size=4) | hs.dictionaries(hs.text(max_size=8), children, max_size=4),
    max_leaves=8)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@pytest.fixture(scope="module")
def fuzz_dir(small, tmp_path_factory):
    root, outs = small
    d = tmp_path_factory.mktemp("fuzz") / "b"
    shutil.copytree(root, d)
    return d, outs, json.loads((root / "manifest.json").read_text())


@pytest.mark.parametrize("examples", [40, pytest.param(150, marks=pytest.mark.slow)])
def test_fuzzed_manifests_never_give_a_traceback(fuzz_dir, capsys, examples):
    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=hs.data())
    def run(data):
        root, outs, base = fuzz_dir
        m = copy.deepcopy(base)
        for _ in range(data.draw(hs.integers(1, 3))):
            paths = list(_paths(m))
            path = data.draw(hs.sampled_from(paths[1:]))
            parent = m
            for k in path[:-1]:
                parent = parent[k]
            action = data.draw(hs.sampled_from(["replace", "delete", "insert"]))
            if action == "delete":
                del parent[path[-1]]
            elif action == "insert" and isinstance(parent, dict):
                parent[data.draw(hs.text(max_size=8))] = data.draw(_json)
            else:
                parent[path[-1]] = data.draw(_json)
        if data.draw(hs.booleans()) and isinstance(m, dict):
            m["manifest_sha256"] = manifest_digest(m)
        (root / "manifest.json").write_text(json.dumps(m))
        out = root.parent / "fuzz-out.safetensors"
        for argv in (["check", str(root), "--outputs", str(outs)], ["verify", str(root)],
                     ["replay", str(root), "--out", str(out), "--force"]):
            rc = main(argv)
            err = capsys.readouterr().err
            assert rc in (0, 1, 2), (argv, rc, err)
            assert "Traceback" not in err and "internal error" not in err, err
        if os.path.exists(out):
            os.unlink(out)

    run()
