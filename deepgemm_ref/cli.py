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
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F401  (only to report its version)
        except ImportError:
            torch = None
    print(f"torch {torch.__version__ if torch is not None else 'not installed'}")
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
        for n in missing:
            print(f"  [ ] {n}")
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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors, 0 on --help
        return int(e.code or 0)
    try:
        return int(args.func(args))
    except DGArgumentError as e:
        print(f"deepgemm-ref: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
