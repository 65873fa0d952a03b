"""The ``deepgemm-ref`` command.

Exit codes: 0 success, 1 a check found a mismatch, 2 a usage or input error.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from . import __version__
from .errors import DGArgumentError

__all__ = ["main"]


def _cmd_info(args: argparse.Namespace) -> int:
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
        done, missing = names.implementation_status(target)
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


class _Progress:
    """A one-line progress bar with ETA on stderr; silent when stderr is not a terminal."""

    def __init__(self, label: str, enabled: bool | None = None) -> None:
        import time

        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.monotonic()
        self._time = time.monotonic

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self.enabled or total == 0:
            return
        elapsed = self._time() - self.t0
        eta = elapsed / done * (total - done) if done else float("nan")
        width = 30
        fill = int(width * done / total)
        bar = "#" * fill + "-" * (width - fill)
        eta_s = "--" if eta != eta else f"{eta:5.0f}s"
        sys.stderr.write(f"\r{self.label} [{bar}] {done}/{total} ETA {eta_s} {what[:40]:<40}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _load_specs(path: str) -> list[dict]:
    import json

    text = open(path, encoding="utf-8").read()
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError as e:  # Python 3.10
            raise DGArgumentError("golden: --spec: TOML needs Python >= 3.11 (use JSON)") from e
        data = tomllib.loads(text)
    else:
        data = json.loads(text)
    cases = data.get("cases") if isinstance(data, dict) else data
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise DGArgumentError(f"golden: --spec {path}: expected a list of case tables (or {{'cases': [...]}})")
    return cases


def _cmd_list(args: argparse.Namespace) -> int:
    from .golden import PRESETS, preset

    for name in PRESETS:
        cases = preset(name)
        print(f"{name}: {len(cases)} cases")
        if args.verbose:
            for c in cases:
                print(f"  {c['id']}: {c['kernel']} ({c['profile']})")
    return 0


def _cmd_golden(args: argparse.Namespace) -> int:
    from . import golden

    if (args.preset is None) == (args.spec is None):
        raise DGArgumentError("golden: give exactly one of --preset NAME or --spec FILE")
    try:
        specs = golden.preset(args.preset) if args.preset else _load_specs(args.spec)
    except (OSError, ValueError) as e:
        raise DGArgumentError(f"golden: cannot read the specification: {e}") from e
    if args.case:
        unknown = sorted(set(args.case) - {s["id"] for s in specs})
        if unknown:
            raise DGArgumentError(f"golden: --case: no case {', '.join(map(repr, unknown))} in "
                                  f"{'preset ' + repr(args.preset) if args.preset else args.spec}")
        specs = [s for s in specs if s["id"] in set(args.case)]
    manifest = golden.generate(specs, args.out, force=args.force, resume=args.resume, jobs=args.jobs,
                               executor=args.executor, scheduler=args.scheduler, progress=_Progress("golden"))
    print(f"wrote {len(manifest['cases'])} cases to {args.out}")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from . import golden

    use_torch = None if args.torch is None else args.torch
    out = golden.replay(args.bundle, args.out, module=args.module, use_torch=use_torch, device=args.device,
                        transforms=not args.no_transforms, force=args.force, cases=args.case or None,
                        accumulation=args.accumulation, progress=_Progress("replay"))
    print(f"wrote {len(out)} outputs to {args.out}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    import json

    from . import golden

    options = golden.CheckOptions(lam=args.lam, u_acc=args.u_acc, n=args.n)
    bundle = golden.load_bundle(args.bundle)
    outputs = golden.load_outputs(args.outputs)
    reports = golden.check_outputs(bundle, outputs, options, args.case or None, progress=_Progress("check"))
    if args.json:
        print(json.dumps([r.to_json() for r in reports], indent=1))
    else:
        print(golden.format_report(reports))
    if args.plot:
        from .golden.plot import plot_reports

        written = plot_reports(reports, args.plot)
        print(f"wrote {len(written)} heatmap(s) under {args.plot}", file=sys.stderr)  # stdout may be JSON
    return 1 if any(r.status == "fail" for r in reports) else 0


def _cmd_probe(args: argparse.Namespace) -> int:
    import json

    from . import golden
    from .golden.probes import analyse

    result = analyse(golden.load_outputs(args.outputs))
    if not result:
        raise DGArgumentError("probe analyse: the outputs hold no probe-* case outputs")
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from . import golden

    result = golden.verify(args.bundle, regenerate=args.regenerate)
    for p in result["problems"]:
        print(p)
    print(f"{result['cases']} cases: {'OK' if result['ok'] else 'PROBLEMS FOUND'}")
    return 0 if result["ok"] else 1


def _power_or_float(text: str) -> float:
    """A float, or a power of two written 2^e or 2**e (e.g. --u-acc 2^-13)."""
    t = text.strip().replace("**", "^")
    if t.startswith("2^"):
        try:
            return 2.0 ** int(t[2:])
        except ValueError:
            pass
    try:
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 2^e; got {text!r}") from None


def _preset_names() -> list[str]:
    from .golden import PRESETS

    return list(PRESETS)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deepgemm-ref", description="DeepGEMM reference emulator and golden values")
    p.add_argument("--version", action="version", version=f"deepgemm-ref {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="versions, the active arch profile, implemented DeepGEMM names")
    info.add_argument("-v", "--verbose", action="store_true", help="also list the implemented names")
    info.set_defaults(func=_cmd_info)
    demo = sub.add_parser("demo", help="quantise a random matrix with DeepGEMM's utilities")
    demo.add_argument("--m", type=int, default=4)
    demo.add_argument("--n", type=int, default=512)
    demo.add_argument("--gran-k", type=int, default=128)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo)

    lst = sub.add_parser("list", help="the golden presets and their cases")
    lst.add_argument("-v", "--verbose", action="store_true")
    lst.set_defaults(func=_cmd_list)

    gen = sub.add_parser("golden", help="generate a golden bundle from a preset or a case specification")
    gen.add_argument("--preset",
                     help="one of: " + ", ".join(_preset_names()) + " (deepgemm-ref list -v shows the cases)")
    gen.add_argument("--spec", help="a JSON or TOML file with a list of case tables")
    gen.add_argument("--out", required=True, help="bundle directory")
    gen.add_argument("--case", action="append", help="only this case id (repeatable)")
    gen.add_argument("--force", action="store_true", help="overwrite an existing bundle")
    gen.add_argument("--resume", action="store_true", help="keep the verified cases of an existing bundle")
    gen.add_argument("--jobs", type=int, default=1, help="worker processes (each gets its share of BLAS threads)")
    gen.add_argument("--executor", choices=("local", "dask"), default="local")
    gen.add_argument("--scheduler", help="dask.distributed scheduler address (with --executor dask)")
    gen.set_defaults(func=_cmd_golden)

    rep = sub.add_parser("replay", help="run a bundle through a library and save its outputs")
    rep.add_argument("bundle")
    rep.add_argument("--module", default="deepgemm_ref", help="deep_gemm on the device host (default deepgemm_ref)")
    rep.add_argument("--out", required=True, help="outputs .safetensors file")
    rep.add_argument("--device", default=None, help="torch device for inputs and outputs (npu, cuda, cpu)")
    rep.add_argument("--torch", dest="torch", action="store_true", default=None, help="pass torch tensors")
    rep.add_argument("--no-torch", dest="torch", action="store_false", help="pass NumPy arrays")
    rep.add_argument("--no-transforms", action="store_true", help="skip the manifest's layout transforms")
    rep.add_argument("--case", action="append", help="only this case id (repeatable)")
    rep.add_argument("--force", action="store_true", help="overwrite an existing outputs file")
    rep.add_argument("--accumulation", help="with --module deepgemm_ref: emulate a device accumulator, "
                     "e.g. 'limited(13, 128)' or 'fp32'")
    rep.set_defaults(func=_cmd_replay)

    chk = sub.add_parser("check", help="check a device's outputs against a bundle (exit 1 on mismatch)")
    chk.add_argument("bundle")
    chk.add_argument("--outputs", required=True, help="safetensors with <case id>/<output> names, or a .npy")
    chk.add_argument("--lambda", dest="lam", type=float, default=8.0,
                     help="lambda of the probabilistic bound lambda*sqrt(n)*u_acc*S (default 8)")
    chk.add_argument("--u-acc", dest="u_acc", type=_power_or_float, default=None,
                     help="unit roundoff of the device accumulator, e.g. 2^-13 or 1.2e-4 (default: the "
                          "case's, 2^-24 for float32)")
    chk.add_argument("--n", type=int, default=None, help="rounding-path length (default: the case's K)")
    chk.add_argument("--case", action="append", help="only this case id (repeatable)")
    chk.add_argument("--json", action="store_true", help="JSON report")
    chk.add_argument("--plot", metavar="DIR", help="write a PNG heatmap per case (needs matplotlib)")
    chk.set_defaults(func=_cmd_check)

    prb = sub.add_parser("probe", help="analyse a device's outputs of the ascend-probes preset")
    prb_sub = prb.add_subparsers(dest="probe_command", required=True)
    ana = prb_sub.add_parser("analyse", help="print the inferred accumulator, rounding and UE8M0 reading")
    ana.add_argument("outputs", help="outputs .safetensors of a replayed ascend-probes bundle")
    ana.add_argument("--json", action="store_true")
    ana.set_defaults(func=_cmd_probe)

    ver = sub.add_parser("verify", help="verify every hash of a bundle; --regenerate rebuilds and compares bytes")
    ver.add_argument("bundle")
    ver.add_argument("--regenerate", action="store_true")
    ver.set_defaults(func=_cmd_verify)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    try:
        return int(args.func(args))
    except (DGArgumentError, OSError) as e:
        print(f"deepgemm-ref: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
