"""The ``deepgemm-ref`` command.

Exit codes: 0 success; 1 a check found a mismatch (or a missing or failed case), a replayed
case failed, or diagnose found a failing case (explained or not); 2 a usage, input,
specification, manifest, outputs-file or resource error (a one-line message naming the file,
case and key; never a traceback; ``DEEPGEMM_REF_TRACEBACK=1`` shows one); 130 / 143 generation
interrupted by SIGINT / SIGTERM (finished cases kept, see ``golden --resume``).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ._version import __version__
from .errors import DGArgumentError

__all__ = ["main"]


def count(n: int, word: str, words: str | None = None) -> str:
    """``"1 case"`` / ``"2 cases"`` (:func:`deepgemm_ref.golden.text.count`, imported when used)."""
    from .golden.text import count as _count

    return _count(n, word, words)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``word`` or its plural for ``n`` (:func:`deepgemm_ref.golden.text.plural`)."""
    from .golden.text import plural as _plural

    return _plural(n, word, words)


def _case_option(p: argparse.ArgumentParser) -> None:
    """``--case``, the same on every command: several ids after one ``--case``, repeated, or both."""
    p.add_argument("--case", action="extend", nargs="+", metavar="ID",
                   help="only these case ids (--case A B, or repeated: --case A --case B)")


def _cmd_info(args: argparse.Namespace) -> int:
    import deepgemm_ref

    from . import names, profiles

    print(f"deepgemm_ref {__version__}")
    print(f"python {platform.python_version()}, numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}")
    import importlib

    torch_mod = sys.modules.get("torch")
    if torch_mod is None:
        try:
            torch_mod = importlib.import_module("torch")  # only to report its version
        except ImportError:
            torch_mod = None
    print(f"torch {torch_mod.__version__ if torch_mod is not None else 'not installed'}")
    p = profiles.get_profile()
    print(f"active arch profile: {p.name} ({p.description})")
    print(f"profiles: {', '.join(profiles.PROFILES)}")
    for target in ("deepgemm", "deepgemm-ascend"):
        done, missing = names.implementation_status(target, deepgemm_ref)
        label = "DeepGEMM 2.6.1" if target == "deepgemm" else "DeepGEMM-Ascend"
        print(f"\n{label}: {len(done)} of {len(done) + len(missing)} public names implemented")
        if args.verbose:
            for n in done:
                print(f"  [x] {n}")
        for n, why in missing.items():
            print(f"  [ ] {n}: {why}")
        for n, why in names.NOT_PROVIDED.items():
            print(f"  (not provided) {n}: {why}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """Quantise a seeded random matrix with DeepGEMM's utilities and show what came out."""
    from . import quant
    from .formats import E4M3, decode

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.m, args.n)).astype(np.float32).astype(ml_dtypes.bfloat16)
    print(f"input: bf16 ({args.m}, {args.n}), seed {args.seed}")
    for use_ue8m0 in (False, True):
        q, sf = quant.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=args.gran_k)
        deq = decode(q.view(np.uint8), E4M3) * np.repeat(sf.astype(np.float64), args.gran_k, axis=1)[:, : args.n]
        err = np.abs(deq - x.astype(np.float64)).max()
        print(f"\nper_token_cast_to_fp8(use_ue8m0={use_ue8m0}, gran_k={args.gran_k}):")
        print(f"  fp8 codes, row 0: {' '.join(f'{b:02x}' for b in q.view(np.uint8)[0, :16])} ...")
        print(f"  scales, row 0:    {sf[0, :4]} ...")
        print(f"  max |dequantised - input| = {err:.3e}")
    packed, sf4 = quant.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32, use_packed_ue8m0=True)
    back = quant.cast_back_from_fp4(packed, sf4, gran_k=32, use_packed_ue8m0=True)
    print("\nper_token_cast_to_fp4(use_ue8m0=True, gran_k=32, use_packed_ue8m0=True):")
    print(f"  packed fp4 bytes, row 0: {' '.join(f'{b:02x}' for b in packed.view(np.uint8)[0, :16])} ...")
    print(f"  packed ue8m0 scales, row 0: {' '.join(f'{int(v) & 0xFFFFFFFF:08x}' for v in sf4[0, :4])}")
    print(f"  calc_diff(cast_back_from_fp4, input) = {float(_calc_diff(back, x)):.3e}")
    return 0


def _calc_diff(a: np.ndarray, b: np.ndarray) -> float:
    from .testing import calc_diff

    return float(calc_diff(a, b))


def _progress(label: str) -> Any:
    from .golden.progress import Progress

    return Progress(label)


#: The largest specification file read.
_MAX_SPEC_BYTES = 64 << 20


def _load_specs(path: str) -> list[Any]:
    """The case tables of a JSON or TOML specification file (strict: duplicate keys, NaN and
    unknown top-level keys are refused)."""
    from .golden.reading import read_table_file

    # a regular file of at most _MAX_SPEC_BYTES (never a FIFO or /dev/zero read without end)
    data = read_table_file(path, "specification file", "golden: --spec", limit=_MAX_SPEC_BYTES)
    if isinstance(data, dict):
        extra = sorted(set(data) - {"cases"})
        if extra or "cases" not in data:
            raise DGArgumentError(f"golden: --spec {path}: a table holds only 'cases' (a list of case tables); "
                                  f"got the keys {sorted(data)}")
        data = data["cases"]
    if not isinstance(data, list):
        raise DGArgumentError(f"golden: --spec {path}: expected a list of case tables (or {{'cases': [...]}}); "
                              f"got {type(data).__name__}")
    return data


def _shape_text(shape: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _list_width() -> int:
    """The width ``list -v`` wraps its lines to: the terminal's (at least 40 columns), or 100 when
    standard output is not a terminal."""
    import shutil

    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return max(40, shutil.get_terminal_size((100, 24)).columns) if tty else 100


def _wrapped(text: str, width: int, indent: str = "") -> str:
    """``text`` wrapped to ``width`` columns, every line after the first indented four more
    columns than ``indent`` (no word is lost: a word longer than a line is broken)."""
    import textwrap

    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent + "    ",
                         break_on_hyphens=False) or indent


def _list_data() -> dict[str, Any]:
    """Everything ``list -v`` shows, in full, as JSON-ready data (``list --json``): each preset's
    cases and its estimates (disk, the largest case's peak memory, serial time on this machine)."""
    from .golden import PRESETS, preset
    from .golden.cases import FAMILIES, estimate_case
    from .golden.generation import validate_specs
    from .golden.schema import common_key_docs, describe_key

    presets: dict[str, list[dict[str, Any]]] = {}
    estimates: dict[str, dict[str, float]] = {}
    for name in PRESETS:
        specs = validate_specs(preset(name))
        presets[name] = [{"id": s.id, "kernel": s.kernel, "profile": s.profile, "shape": s.shape(),
                          "spec": s.to_dict()} for s in specs]
        ests = [e for e in (estimate_case(s) for s in specs) if e is not None]
        estimates[name] = {"disk_bytes": sum(e.file_bytes for e in ests),
                           "peak_bytes": max((e.peak_bytes for e in ests), default=0),
                           "seconds": round(sum(e.seconds for e in ests), 3)}
    families = {fam.name: {"kernels": {k: list(p) for k, p in fam.schema.kernels.items()},
                           "why_not": dict(fam.schema.why_not),
                           "keys": [describe_key(key, fam.schema) for key in fam.schema.keys],
                           "checks": [rule.doc for rule in fam.schema.rules]}
                for fam in FAMILIES.values() if fam.schema is not None}
    return {"presets": presets, "estimates": estimates, "common_keys": common_key_docs(), "families": families}


def _estimate_text(est: dict[str, float]) -> str:
    """A preset's estimated disk, peak memory (its largest case) and serial time on this machine."""
    from .golden.resources import format_seconds
    from .toolkit.sizes import format_size

    return (f"; estimated disk {format_size(int(est['disk_bytes']))}, peak memory "
            f"{format_size(int(est['peak_bytes']))} (its largest case), time "
            f"{format_seconds(est['seconds'])} (serial, this machine)")


def _cmd_list(args: argparse.Namespace) -> int:
    import json

    data = _list_data()
    if args.json:
        print(json.dumps(data, indent=1, ensure_ascii=True))
        return 0
    width = _list_width()
    for name, cases in data["presets"].items():
        print(_wrapped(f"{name}: {count(len(cases), 'case')}"
                       + (_estimate_text(data["estimates"][name]) if args.verbose else ""), width))
        if args.verbose:
            id_width = min(max(len(c["id"]) for c in cases), width // 2)
            for c in cases:
                print(_wrapped(f"{c['id']:<{id_width}}  {c['kernel']} ({c['profile']})  {_shape_text(c['shape'])}",
                               width, "  "))
    if args.verbose:
        print()
        print(_wrapped("case specification keys (docs/case-specs.md; as JSON: deepgemm-ref list --json):", width))
        print(_wrapped("every case: " + "; ".join(f"{d['name']} ({d['type']}, default {d['default']})"
                                                  for d in data["common_keys"]), width, "  "))
        for fam_name, fam in data["families"].items():
            print()
            print(_wrapped(f"family {fam_name}: kernels " + ", ".join(f"{k} ({'/'.join(p)})"
                                                                      for k, p in fam["kernels"].items()), width))
            for d in fam["keys"]:
                extra = f"; {d['only']}" if d["only"] else ""
                print(_wrapped(f"{d['name']}: {d['type']}; default {d['default']}; read by {d['read_by']}{extra}",
                               width, "  "))
            for rule in fam["checks"]:
                print(_wrapped(f"check: {rule}", width, "  "))
    return 0


def _cmd_golden(args: argparse.Namespace) -> int:
    from . import golden
    from .golden.generation import validate_specs
    from .golden.schema import did_you_mean

    if (args.preset is None) == (args.spec is None):
        raise DGArgumentError("golden: give exactly one of --preset NAME or --spec FILE")
    if not args.out:
        raise DGArgumentError("golden: --out: expected a bundle directory path; got '' (an empty path)")
    if args.preset is not None:
        source = f"preset {args.preset!r}"
        raw = golden.preset(args.preset)
    else:
        source = args.spec
        raw = _load_specs(args.spec)
    specs = validate_specs(raw, source)
    if args.case:
        known = [s.id for s in specs]
        unknown = [c for c in dict.fromkeys(args.case) if c not in known]
        if unknown:
            hints = "".join(f" (did you mean {' or '.join(map(repr, did_you_mean(c, known)))}?)"
                            if did_you_mean(c, known) else "" for c in unknown[:1])
            raise DGArgumentError(f"golden: --case: no case {', '.join(map(repr, unknown))} in {source}{hints}")
        specs = [s for s in specs if s.id in set(args.case)]

    _check_golden_out(args)

    def show(plan: Any) -> None:
        if args.dry_run:
            print(plan.table())
        print(plan.summary(), flush=True)

    result = golden.generate(specs, args.out, force=args.force, resume=args.resume, jobs=args.jobs,
                             executor=args.executor, scheduler=args.scheduler, progress=_progress("golden"),
                             max_memory=args.max_memory, dry_run=args.dry_run, on_plan=show, source=source,
                             ranks_per_case=args.ranks_per_case,
                             on_note=lambda text: print(f"deepgemm-ref: golden: note: {text}", file=sys.stderr,
                                                        flush=True))
    if not args.dry_run:
        print(f"wrote {count(len(result['cases']), 'case')} to {args.out}")
    return 0


def _check_golden_out(args: argparse.Namespace) -> None:
    """``golden --out``: a directory or nothing, not the spec file, in no other bundle."""
    from .golden.paths import check_output_dir

    check_output_dir("golden: --out", args.out, [("--spec", args.spec)] if args.spec else [], own_bundle=args.out,
                     need_parent=False, follow_symlink=True)


def _cmd_replay(args: argparse.Namespace) -> int:
    from . import golden
    from .golden.paths import check_output_file

    check_output_file("replay: --out", args.out, [("BUNDLE", args.bundle)])
    # As ``python -m`` does, the current directory comes first on sys.path while --module is
    # imported: a module next to the user is found (and shadows an installed one of its name).
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        out = golden.replay(args.bundle, args.out, module=args.module, use_torch=args.torch, device=args.device,
                            transforms=not args.no_transforms, force=args.force, cases=args.case or None,
                            accumulation=args.accumulation, progress=_progress("replay"), max_memory=args.max_memory)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)
    n_fail = len(out.errors)
    if not out.written:  # a rank other than 0 under torchrun: rank 0 reports and writes
        print(f"rank {out.rank} of {out.world}: replayed its rank of the EP cases; rank 0 wrote {args.out}"
              + (f"; {n_fail} of those {plural(n_fail, 'case')} failed" if n_fail else ""))
        return _leave_world(1 if n_fail else 0)
    for case_id, err in out.errors.items():
        print(f"deepgemm-ref: replay: case {case_id!r} failed: {err}", file=sys.stderr)
    for case_id, note in out.notes.items():
        print(f"deepgemm-ref: replay: note: case {case_id!r}: {note}", file=sys.stderr)
    print(f"wrote {count(len(out), 'output')} to {args.out}"
          + (f"; {count(n_fail, 'case')} failed (errors recorded in the outputs file)" if n_fail else ""))
    code = 1 if n_fail else 0
    return _leave_world(code) if out.world > 1 else code


def _leave_world(code: int) -> int:
    """A replay process of a torchrun world ends at once, its outputs written and its group
    destroyed: gloo can abort a process ("terminate called without an active exception") when
    the interpreter's teardown frees objects that still hold the process group."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _check_options(args: argparse.Namespace) -> Any:
    from . import golden

    return golden.CheckOptions(lam=args.lam, u_acc=args.u_acc, n=args.n, accumulation=args.accumulation,
                               bias_test=not args.no_bias_test, bias_threshold=args.bias_threshold)


def _check_report_paths(args: argparse.Namespace) -> None:
    """Every path ``check`` writes, before any work: a regular file or nothing (``--plot``: a
    directory or nothing), none of the run's inputs, two of them never the same file, none inside
    a bundle (exit 2 naming the option and the path)."""
    from .golden.paths import check_distinct, check_output_dir, check_output_file

    inputs = [("BUNDLE", args.bundle), ("--outputs", args.outputs)]
    if args.thresholds:
        inputs.append(("--thresholds", args.thresholds))
    files = [("check: --junit", args.junit), ("check: --html", args.html),
             ("check: --compare-table", args.compare_table)]
    for flag, path in files:
        if path is not None:
            check_output_file(flag, path, inputs)
    if args.plot is not None:
        check_output_dir("check: --plot", args.plot, inputs, need_parent=False)
    check_distinct(files + [("check: --plot", args.plot)])


def _replay_errors(outputs: str) -> dict[str, str]:
    """The failed cases a replay recorded in an outputs file (none for a .npy)."""
    from .golden.replay import read_replay_record

    return {} if outputs.endswith(".npy") else read_replay_record(outputs)[0]


def _cmd_check(args: argparse.Namespace) -> int:
    import time

    from . import golden
    from .golden.check import reports_json

    _check_report_paths(args)
    thresholds = _thresholds(args)
    options = _check_options(args)
    t0 = time.perf_counter()
    bundle = golden.load_bundle(args.bundle, max_memory=args.max_memory)
    outputs = golden.load_outputs(args.outputs, max_memory=args.max_memory)
    errors = _replay_errors(args.outputs)
    reports = golden.check_outputs(bundle, outputs, options, args.case or None, _progress("check"), errors)
    seconds = time.perf_counter() - t0
    diagnoses = None
    if args.diagnose:
        from .golden.diagnose import diagnose_outputs

        diagnoses = diagnose_outputs(bundle, outputs, options=options, cases=args.case or None, errors=errors,
                                     progress=_progress("diagnose"), reports=reports)
    table = None
    if args.compare_table or args.html or thresholds is not None:  # msprobe's columns beside ours
        from .golden.compare_table import compare_rows

        table = compare_rows(bundle, outputs, reports, thresholds=thresholds, diagnoses=diagnoses)
    if args.json:
        if diagnoses is None:
            print(reports_json(reports))
        else:
            import json

            from .golden.check import strict_json_value

            print(json.dumps({"reports": [r.to_json() for r in reports],
                              "diagnosis": [strict_json_value(d.to_json()) for d in diagnoses]},
                             indent=1, allow_nan=False))
    else:
        print(golden.format_report(reports, quiet=args.quiet))
        if diagnoses is not None:
            from .golden.diagnose import format_diagnoses

            print(format_diagnoses(diagnoses, quiet=True))
    if args.plot:
        from .golden.plot import plot_reports

        written = plot_reports(reports, args.plot)
        print(f"wrote {len(written)} heatmap(s) under {args.plot}", file=sys.stderr)  # stdout may be JSON
    if args.junit:
        from .golden.junit import write_junit

        write_junit(args.junit, reports, bundle_name=os.path.basename(os.path.normpath(args.bundle)),
                    cases=bundle.cases, seconds=seconds, diagnoses=diagnoses)
        print(f"wrote the JUnit report {args.junit}", file=sys.stderr)
    if args.html:
        from .golden.html import write_html

        write_html(args.html, reports, bundle=args.bundle, outputs=args.outputs, diagnoses=diagnoses,
                   cases=bundle.cases, compare_table=table)
        print(f"wrote the HTML report {args.html}", file=sys.stderr)
    if args.compare_table and table is not None:
        from .golden.compare_table import write_compare_table

        write_compare_table(args.compare_table, table)
        print(f"wrote the compare table {args.compare_table}", file=sys.stderr)
    if args.verdict == "thresholds":  # the threshold table's verdict as the exit code, asked for
        return 1 if any(r.thresholds is None or r.thresholds["status"] == "fail" for r in reports) else 0
    return 1 if any(r.status == "fail" for r in reports) else 0


def _thresholds(args: argparse.Namespace) -> Any:
    """The threshold table of ``--thresholds`` (the CANN samples' rule with ``--verdict thresholds``
    alone; None without either), and the ``.xlsx`` writer's presence, checked before any work."""
    from .golden import compare_table as ct

    if args.compare_table and args.compare_table.lower().endswith(".xlsx") and not ct.xlsx_available():
        raise DGArgumentError(f"check: --compare-table {args.compare_table}: .xlsx needs openpyxl (pip install "
                              "openpyxl), or write .csv")
    if args.thresholds:
        return ct.load_thresholds(args.thresholds)
    return ct.CANN_DEFAULT if args.verdict == "thresholds" else None


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from . import golden
    from .golden.diagnose import diagnose_outputs, diagnoses_json, format_diagnoses

    options = _check_options(args)
    bundle = golden.load_bundle(args.bundle, max_memory=args.max_memory)
    outputs = golden.load_outputs(args.outputs, max_memory=args.max_memory)
    errors = _replay_errors(args.outputs)
    diagnoses = diagnose_outputs(bundle, outputs, options=options, cases=args.case or None, errors=errors,
                                 progress=_progress("diagnose"))
    print(diagnoses_json(diagnoses) if args.json else format_diagnoses(diagnoses, quiet=args.quiet))
    return 1 if any(d.status in ("fail", "error") for d in diagnoses) else 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .golden.export import export
    from .golden.paths import check_output_dir

    check_output_dir("export: --out", args.out, [("BUNDLE", args.bundle)]
                     + ([("--outputs", args.outputs)] if args.outputs else []), need_parent=False)
    result = export(args.bundle, args.out, args.format, outputs=args.outputs, cases=args.case or None,
                    force=args.force, max_memory=args.max_memory)
    what = "device outputs" if args.outputs else "goldens"
    print(f"wrote the {what} of {count(len(result['cases']), 'case')} as {args.format} to {args.out} "
          f"({count(result['files'], 'file')})")
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    import json

    from . import golden
    from .golden.probes import analyse

    result = analyse(golden.load_outputs(args.outputs))
    if not result:
        raise DGArgumentError("probe analyse: the outputs hold no probe-* case outputs")
    if args.json:
        from .golden.check import strict_json_value

        print(json.dumps(strict_json_value(result), indent=1, default=str, allow_nan=False))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from . import golden

    result = golden.verify(args.bundle, regenerate=args.regenerate, progress=_progress("verify"),
                           max_memory=args.max_memory)
    for p in result["problems"]:
        print(p)
    if args.regenerate:
        print(f"regenerated {result['regenerated']} of {count(result['cases'], 'case')} and compared every tensor "
              "with the stored bytes")
    print(f"{count(result['cases'], 'case')}: {'OK' if result['ok'] else 'PROBLEMS FOUND'}")
    return 0 if result["ok"] else 1


def _power_or_float(text: str) -> float:
    """A unit roundoff in (0, 1): a float, or a power of two written 2^e or 2**e (e.g. --u-acc
    2^-13); range-checked before use (2^5000 or 1e999 is refused, not an overflow)."""
    t = text.strip().replace("**", "^")
    value: float | None = None
    if t.startswith("2^"):
        try:
            e = int(t[2:])
        except ValueError:
            pass
        else:
            if not -1074 <= e < 0:
                raise argparse.ArgumentTypeError(f"expected a unit roundoff in (0, 1): 2^e with -1074 <= e < 0; "
                                                 f"got {text!r}")
            value = 2.0 ** e
    if value is None:
        try:
            value = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number or 2^e; got {text!r}") from None
    if not (math.isfinite(value) and 0.0 < value < 1.0):
        raise argparse.ArgumentTypeError(f"expected a unit roundoff in (0, 1); got {text!r}")
    return value


def _float_in(lo: float | None, hi: float | None, what: str) -> Callable[[str], float]:
    """An argparse type: a finite float strictly between ``lo`` and ``hi`` (None: unbounded)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
        if not math.isfinite(v) or (lo is not None and v <= lo) or (hi is not None and v >= hi):
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")
        return v

    return parse


def _int_in(lo: int, hi: int, what: str, too_big: str | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [lo, hi] (``too_big``: what a value over ``hi`` is told)."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {too_big if too_big and v > hi else what}; got {text!r}")
        return v

    return parse


def _size(text: str) -> int:
    from .golden.resources import parse_size

    try:
        return parse_size(text)
    except DGArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: The most worker processes (--jobs) and ranks per case (--ranks-per-case).
_MAX_PROCESSES = 1024

_positive_int = _int_in(1, _MAX_PROCESSES, "a positive integer", f"a positive integer <= {_MAX_PROCESSES}")


def _preset_names() -> list[str]:
    from .golden import PRESETS

    return list(PRESETS)


def _check_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments check and diagnose share: bundle, outputs, the bound, cases, memory."""
    p.add_argument("bundle")
    p.add_argument("--outputs", required=True,
                   help="safetensors with <case id>/<output> names, a .npy, or a dump directory (msprobe, or "
                        "<case id>/<output>.npy|.bin with .json sidecars; see export)")
    p.add_argument("--lambda", dest="lam", type=_float_in(0.0, None, "a finite number > 0"), default=8.0,
                   help="lambda of the probabilistic bound lambda*sqrt(n)*u_acc*S (default 8)")
    p.add_argument("--u-acc", dest="u_acc", type=_power_or_float, default=None,
                   help="unit roundoff of the device accumulator, e.g. 2^-13 or 1.2e-4 (default: the "
                        "case's, 2^-24 for float32)")
    p.add_argument("--n", type=_int_in(1, 2**53, "a rounding-path length in [1, 2^53]"), default=None,
                    help="rounding-path length (default: the case's K)")
    p.add_argument("--accumulation", default=None, metavar="MODEL",
                   help="the device's accumulator model: fp32 (default: float32 in any order) or "
                        "'limited(bits, interval)' (docs/numerics.md); sets u_acc 2^-bits unless --u-acc is given, "
                        "and is the bias test's null")
    p.add_argument("--no-bias-test", action="store_true",
                   help="skip the systematic-error test (do the errors lean one way?)")
    p.add_argument("--bias-threshold", type=_float_in(None, 0.0, "a finite log10 p-value < 0"), default=-12.0,
                   metavar="LOG10P",
                   help="log10 p-value below which an output's errors lean too far one way and it fails "
                        "(default -12; docs/numerics.md)")
    _case_option(p)
    p.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                   help="refuse files over SIZE (default: half of this machine's memory)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deepgemm-ref", description="DeepGEMM reference emulator and golden values")
    p.add_argument("--version", action="version", version=f"deepgemm-ref {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, the active arch profile, implemented DeepGEMM names")
    info.add_argument("-v", "--verbose", action="store_true", help="also list the implemented names")
    info.set_defaults(func=_cmd_info)
    demo = sub.add_parser("demo", help="quantise a random matrix with DeepGEMM's utilities")
    demo.add_argument("--m", type=_int_in(1, 4096, "rows in [1, 4096]"), default=4)
    demo.add_argument("--n", type=_int_in(1, 65536, "columns in [1, 65536]"), default=512)
    demo.add_argument("--gran-k", type=_int_in(1, 65536, "a granularity in [1, 65536]"), default=128)
    demo.add_argument("--seed", type=_int_in(0, 2**64 - 1, "a seed in [0, 2^64)"), default=0)
    demo.set_defaults(func=_cmd_demo)

    lst = sub.add_parser("list", help="the golden presets and their cases")
    lst.add_argument("-v", "--verbose", action="store_true",
                     help="every case with its real shape, and every family's specification keys (lines "
                          "wrapped to the terminal's width, or 100 columns)")
    lst.add_argument("--json", action="store_true",
                     help="everything -v shows, in full, as JSON (each case's specification, each key's text)")
    lst.set_defaults(func=_cmd_list)

    gen = sub.add_parser("golden", help="generate a golden bundle from a preset or a case specification")
    gen.add_argument("--preset",
                     help="one of: " + ", ".join(_preset_names()) + " (deepgemm-ref list -v shows the cases)")
    gen.add_argument("--spec", help="a JSON or TOML file with a list of case tables")
    gen.add_argument("--out", required=True, help="bundle directory")
    _case_option(gen)
    gen.add_argument("--force", action="store_true", help="overwrite an existing bundle")
    gen.add_argument("--resume", action="store_true", help="keep the verified cases of an existing bundle")
    gen.add_argument("--jobs", type=_positive_int, default=1,
                     help="worker processes (each gets its share of BLAS threads and of --max-memory)")
    gen.add_argument("--executor", choices=("local", "dask", "processes"), default="local",
                     help="local: this process or --jobs workers; dask: a dask.distributed cluster (--scheduler); "
                          "processes: every case of the EP families (ep_dispatch, ep_combine, Mega MoE) with one "
                          "process per rank over a gloo group (needs torch; rank 0 merges the ranks' goldens, "
                          "docs/case-specs.md), the other cases as with local")
    gen.add_argument("--ranks-per-case", type=_positive_int, default=None, metavar="N",
                     help="with --executor processes: N processes per EP case; every EP case must have N ranks "
                          "(default: each case's own ranks)")
    gen.add_argument("--scheduler", help="dask.distributed scheduler address (with --executor dask)")
    gen.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                     help="refuse cases whose estimated peak memory is over SIZE (e.g. 8G; default: half of this "
                          "machine's total physical memory, or of its cgroup limit when lower); with --jobs N "
                          "each case gets SIZE / N")
    gen.add_argument("--dry-run", action="store_true",
                     help="print the plan (cases, shapes, sizes, time; cases over --max-memory marked OVER) and exit")
    gen.set_defaults(func=_cmd_golden)

    rep = sub.add_parser("replay", help="run a bundle through a library and save its outputs")
    rep.add_argument("bundle")
    rep.add_argument("--module", default="deepgemm_ref", help="deep_gemm on the device host (default deepgemm_ref)")
    rep.add_argument("--out", required=True, help="outputs .safetensors file")
    rep.add_argument("--device", default=None,
                     help="torch device for inputs and outputs (npu, cuda, cpu); the deepgemm_ref module takes "
                     "only cpu (an unavailable device is refused)")
    rep.add_argument("--torch", dest="torch", action="store_true", default=None, help="pass torch tensors")
    rep.add_argument("--no-torch", dest="torch", action="store_false", help="pass NumPy arrays")
    rep.add_argument("--no-transforms", action="store_true", help="skip the manifest's layout transforms")
    _case_option(rep)
    rep.add_argument("--force", action="store_true", help="overwrite an existing outputs file")
    rep.add_argument("--accumulation", help="with --module deepgemm_ref: emulate a device accumulator, "
                     "e.g. 'limited(13, 128)' or 'fp32'")
    rep.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                     help="refuse cases over SIZE of memory (default: half of this machine's)")
    rep.set_defaults(func=_cmd_replay)

    chk = sub.add_parser("check", help="check a device's outputs against a bundle (exit 1 on mismatch)")
    _check_arguments(chk)
    chk.add_argument("--json", action="store_true", help="JSON report (strict: NaN / infinities as strings)")
    chk.add_argument("--quiet", action="store_true", help="no line for passing outputs (failures and the summary)")
    chk.add_argument("--plot", metavar="DIR", help="write a PNG heatmap per failing-capable output (needs matplotlib)")
    chk.add_argument("--junit", metavar="FILE", help="write JUnit XML, one test case per output (for CI dashboards)")
    chk.add_argument("--html", metavar="FILE",
                     help="write one self-contained HTML report (summary, heatmaps, worst elements)")
    chk.add_argument("--diagnose", action="store_true",
                     help="also diagnose every failing case (which known port bug explains it; in the text, JSON "
                          "and HTML reports)")
    chk.add_argument("--compare-table", metavar="FILE",
                     help="write msprobe's compare columns (Cosine, MaxAbsErr, ...; docs/compare-table.md) beside "
                          "this checker's for every output: FILE.csv, or FILE.xlsx (needs openpyxl)")
    chk.add_argument("--thresholds", metavar="FILE",
                     help="also judge every output by a threshold table (TOML or JSON: per output dtype atol, rtol "
                          "and the allowed share of violating elements; docs/compare-table.md), a separate verdict")
    chk.add_argument("--verdict", choices=("bound", "thresholds"), default="bound",
                     help="which verdict is the exit code: the exact-golden bound (default) or the threshold "
                          "table (--thresholds, else the CANN samples' rule)")
    chk.set_defaults(func=_cmd_check)

    dia = sub.add_parser("diagnose", help="explain failing cases: rank the known port bugs by how much of the "
                         "failure each one reproduces")
    _check_arguments(dia)
    dia.add_argument("--json", action="store_true", help="JSON (strict: NaN / infinities as strings)")
    dia.add_argument("--quiet", action="store_true", help="no line for passing cases")
    dia.set_defaults(func=_cmd_diagnose)

    exp = sub.add_parser("export", help="write a bundle's goldens (or a device's outputs) as an msprobe dump or "
                         "CANN-style .npy / .bin golden files")
    exp.add_argument("bundle")
    exp.add_argument("--format", required=True, choices=("msprobe", "npy", "bin"),
                     help="msprobe: DIR/rank0/dump.json + .pt tensors for msprobe compare (needs torch); npy / bin: "
                          "DIR/<case id>/<tensor>.npy|.bin with a .json sidecar (real dtype, shape) per tensor")
    exp.add_argument("--out", required=True, metavar="DIR", help="the export directory")
    exp.add_argument("--outputs", default=None,
                     help="write these device outputs (safetensors or a dump directory) instead of the goldens")
    _case_option(exp)
    exp.add_argument("--force", action="store_true", help="replace an earlier export in DIR")
    exp.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                     help="refuse files over SIZE (default: half of this machine's memory)")
    exp.set_defaults(func=_cmd_export)

    prb = sub.add_parser("probe", help="analyse a device's outputs of the ascend-probes preset")
    prb_sub = prb.add_subparsers(dest="probe_command", required=True)
    ana = prb_sub.add_parser("analyse", help="print the inferred accumulator, rounding and UE8M0 reading")
    ana.add_argument("outputs", help="outputs .safetensors of a replayed ascend-probes bundle")
    ana.add_argument("--json", action="store_true")
    ana.set_defaults(func=_cmd_probe)

    ver = sub.add_parser("verify", help="verify every hash of a bundle; --regenerate rebuilds and compares bytes")
    ver.add_argument("bundle")
    ver.add_argument("--regenerate", action="store_true", help="rebuild every case and compare its bytes")
    ver.add_argument("--max-memory", type=_size, default=None, metavar="SIZE",
                     help="refuse cases over SIZE of memory (default: half of this machine's)")
    ver.set_defaults(func=_cmd_verify)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; never a traceback for an input error (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    saved = _terminate_like_ctrl_c()
    streams = _escape_unencodable()
    try:
        code = int(args.func(args))
    except BaseException as e:  # noqa: B036 - every outcome becomes an exit code and one message
        code = _report(e, exiting=argv is None)
    finally:
        for stream, errors in streams:
            try:
                stream.reconfigure(errors=errors)
            except (AttributeError, ValueError, OSError):
                pass
        if saved is not None and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, saved)
    if argv is None and _left_a_world():
        # A replay under torchrun joined a gloo world and left it (everything is written and
        # closed): end here, as the process would, without the interpreter's teardown, where
        # torch's gloo can abort ("terminate called without an active exception", SIGABRT).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _left_a_world() -> bool:
    replay = sys.modules.get("deepgemm_ref.golden.replay")
    return bool(getattr(replay, "left_a_world", False))


def _escape_unencodable() -> list[tuple[Any, str]]:
    """Reports print any string: what stdout / stderr cannot encode (a lone surrogate such as
    ``"\\ud800"`` from a JSON file, a character outside a narrow locale's charset) is written
    as a backslash escape instead of raising UnicodeEncodeError.  Returns the streams and their
    previous error handlers, restored when the command ends."""
    saved = []
    streams: tuple[Any, ...] = (sys.stdout, sys.stderr)
    for stream in streams:
        errors = getattr(stream, "errors", None)
        if errors in (None, "backslashreplace"):
            continue
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper
            continue
        saved.append((stream, errors))
    return saved


def _terminate_like_ctrl_c() -> Any:
    """SIGTERM ends any command the way Ctrl-C does (one line, exit 143; generation installs its
    own handler on top, which also keeps the finished cases).  Returns the previous handler."""
    from .golden.generation import GenerationInterrupted

    def handler(signum: int, frame: Any) -> None:
        raise GenerationInterrupted(signum)

    try:
        return signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # pragma: no cover - not the main thread
        return None


def _report(e: BaseException, exiting: bool = False) -> int:
    """Map an exception to (message on stderr, exit code); ``exiting``: the process ends next
    (the console script), so a second Ctrl-C is ignored from here on."""
    from .golden.generation import GenerationInterrupted

    if isinstance(e, KeyboardInterrupt) and exiting:  # a second Ctrl-C must not cut the exit short
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                signal.signal(sig, signal.SIG_IGN)
            except (ValueError, OSError):  # pragma: no cover - not the main thread
                pass
    if isinstance(e, GenerationInterrupted):
        _err(e.message)
        return 128 + e.signum
    if isinstance(e, KeyboardInterrupt):
        _err("interrupted")
        return 130
    if isinstance(e, SystemExit):  # never from this package's commands: code they ran (a --module's) ended early
        _err(f"error: code the command ran called sys.exit({e.code!r}) before the command finished")
        return 2
    if os.environ.get("DEEPGEMM_REF_TRACEBACK"):
        raise e
    if isinstance(e, DGArgumentError):
        _err(f"error: {e}")
    elif isinstance(e, MemoryError):
        _err("error: out of memory (lower --max-memory, use fewer --jobs, or smaller cases)")
    elif isinstance(e, OSError):
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        _err(f"error: {where}{e.strerror or e}")
    elif isinstance(e, Exception):
        _err(f"internal error: {type(e).__name__}: {e} (a bug in deepgemm_ref: please report it; "
             "DEEPGEMM_REF_TRACEBACK=1 shows the traceback)")
    else:
        raise e
    return 2


def _err(text: str) -> None:
    try:
        print(f"deepgemm-ref: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
