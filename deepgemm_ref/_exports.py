"""The public namespace as one table: every exported name, its home module, the namespaces it is in.

``deepgemm_ref``, ``deepgemm_ref.utils`` (with ``utils.math`` and ``utils.layout``) mirror
DeepGEMM's and DeepGEMM-Ascend's namespaces; ``deepgemm_ref.runtime`` lists the settings it
defines.  Their import statements and ``__all__`` lists are generated from :data:`TABLE` (between
the ``generated`` markers of each file) and checked by ``tests/test_namespace.py``; after editing
the table, run ``python -m deepgemm_ref._exports`` to rewrite them.

Each row: ``name  home  namespaces``.  ``home`` is the module (relative to ``deepgemm_ref``) that
defines the object, ``module:attr`` when it is defined there under another name, or ``=module``
for a module itself; ``namespaces`` are ``top`` (``deepgemm_ref``), ``utils``, ``utils.math``,
``utils.layout``, or ``-`` (none: a name only of its home, listed for the home's ``__all__``).
A trailing ``only=deepgemm`` or ``only=deepgemm-ascend`` says that only that target exports the
name: under the other target's profiles the namespaces hide it (:mod:`deepgemm_ref.namespace`;
profiled functions are hidden where their target does not provide them without being marked).
This module is data only and imports nothing from the package.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Export", "TABLE", "EXPORTS", "NAMESPACES", "names", "only", "defined_in", "generated_block", "rewrite"]

TABLE = """
SymmBuffer                                             mega               top
get_symm_buffer_for_mega_moe                           mega               top
transform_weights_for_mega_moe                         mega               top
fp8_fp4_mega_moe                                       mega               top
bf16_mega_moe                                          mega               top
mega                                                   =mega              top
k_grouped_bf16_gemm_tn_contiguous                      grouped            top
k_grouped_fp8_gemm_nt_contiguous                       grouped            top
k_grouped_fp8_gemm_tn_contiguous                       grouped            top
m_grouped_bf16_gemm_nn_contiguous                      grouped            top
m_grouped_bf16_gemm_nt_contiguous                      grouped            top
m_grouped_bf16_gemm_nt_masked                          grouped            top
bf16_m_grouped_gemm_nt_masked                          grouped            top
m_grouped_fp8_fp4_gemm_nn_contiguous                   grouped            top
m_grouped_fp8_fp4_gemm_nt_contiguous                   grouped            top
m_grouped_fp8_fp4_gemm_nt_masked                       grouped            top
m_grouped_fp8_gemm_nn_contiguous                       grouped            top
m_grouped_fp8_gemm_nt_contiguous                       grouped            top
m_grouped_fp8_gemm_nt_masked                           grouped            top
fp8_m_grouped_gemm_nt_masked                           grouped            top
einsum                                                 einsum             top
fp8_einsum                                             einsum             top
tf32_hc_prenorm_gemm                                   einsum             top
fp8_fp4_mqa_logits                                     attention          top
fp8_fp4_paged_mqa_logits                               attention          top
fp8_mqa_logits                                         attention          top
fp8_paged_mqa_logits                                   attention          top
get_paged_mqa_logits_metadata                          attention          top
fp8_fp4_gemm_nt                                        gemm               top
fp8_fp4_gemm_nn                                        gemm               top
fp8_fp4_gemm_tn                                        gemm               top
fp8_fp4_gemm_tt                                        gemm               top
fp8_gemm_nt                                            gemm               top
fp8_gemm_nn                                            gemm               top
fp8_gemm_tn                                            gemm               top
fp8_gemm_tt                                            gemm               top
fp8_gemm_nt_skip_head_mid                              gemm               top
bf16_gemm_nt                                           gemm               top
bf16_gemm_nn                                           gemm               top
bf16_gemm_tn                                           gemm               top
bf16_gemm_tt                                           gemm               top
cublaslt_gemm_nt                                       gemm               top
cublaslt_gemm_nn                                       gemm               top
cublaslt_gemm_tn                                       gemm               top
cublaslt_gemm_tt                                       gemm               top
aclnn_bf16_gemm_nt                                     gemm               top
aclnn_bf16_gemm_nn                                     gemm               top
aclnn_bf16_gemm_tn                                     gemm               top
aclnn_bf16_gemm_tt                                     gemm               top
aclnn_fp8_fp4_gemm_nt                                  gemm               top
aclnn_fp8_fp4_gemm_nn                                  gemm               top
aclnn_fp8_fp4_gemm_tn                                  gemm               top
aclnn_fp8_fp4_gemm_tt                                  gemm               top
__version__                                            _version           top
formats                                                =formats           top
testing                                                =testing           top
utils                                                  =utils             top only=deepgemm
math                                                   =utils.math        top utils only=deepgemm
dist                                                   =utils.dist        top utils only=deepgemm
init_dist                                              utils.dist         top utils only=deepgemm
uneven_all_gather                                      utils.dist         top utils only=deepgemm
_C                                                     =_C                top
DGArgumentError                                        errors             top
DGUtilityError                                         errors             top
Limited                                                config             top
get_numerics                                           config             top
numerics                                               settings           top
reset_numerics                                         config             top
set_numerics                                           config             top
get_arch                                               profiles           top
get_profile                                            profiles           top
set_arch                                               profiles           top
align                                                  quant              top utils utils.math
cast_back_from_fp4                                     quant              top utils utils.math
ceil_div                                               quant              top utils utils.math
ceil_to_ue8m0                                          quant              top utils utils.math
pack_ue8m0_to_int                                      quant              top utils utils.math
per_block_cast_to_fp8                                  quant              top utils utils.math
per_channel_cast_to_fp8                                quant              top utils utils.math
per_custom_dims_cast_to_fp8                            quant              top utils utils.math
per_token_cast_to_fp4                                  quant              top utils utils.math
per_token_cast_to_fp8                                  quant              top utils utils.math
transpose_packed_fp4                                   quant              top utils utils.math
unpack_ue8m0_from_int                                  quant              top utils utils.math
epilogue                                               =epilogue          top
locality_domain                                        =locality_domain   top only=deepgemm-ascend
get_num_locality_domains                               locality_domain:profiled_get_num_locality_domains top
is_localization_available                              locality_domain:profiled_is_localization_available top
localize                                               locality_domain:profiled_localize top
is_localized                                           locality_domain:profiled_is_localized top
destroy_localizer                                      locality_domain:profiled_destroy_localizer top
set_num_sms                                            runtime            top
get_num_sms                                            runtime            top
set_tc_util                                            runtime            top
get_tc_util                                            runtime            top
set_pdl                                                runtime            top
get_pdl                                                runtime            top
set_ignore_compile_dims                                runtime            top
set_block_size_multiple_of                             runtime            top
set_mk_alignment_for_contiguous_layout                 runtime            top utils utils.layout
get_mk_alignment_for_contiguous_layout                 runtime            top utils utils.layout
get_m_alignment_for_contiguous_layout                  runtime            top utils utils.layout
get_k_alignment_for_contiguous_layout                  runtime            top utils utils.layout
get_theoretical_mk_alignment_for_contiguous_layout     runtime            top utils utils.layout
set_npu_arch                                           runtime            top
get_npu_arch                                           runtime            top
use_deterministic_algorithms                           runtime            top
get_deterministic_algorithms                           runtime            top
get_library_root_path                                  runtime            top
ASCEND_HOME                                            runtime            top only=deepgemm-ascend
get_tma_aligned_size                                   layout             top utils utils.layout
get_mn_major_tma_aligned_tensor                        layout             top utils utils.layout
get_mn_major_tma_aligned_packed_ue8m0_tensor           layout             top utils utils.layout
get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor layout             top utils utils.layout
transform_sf_into_required_layout                      layout             top
transform_k_grouped_sf_into_required_layout            layout             top
layout                                                 =utils.layout      utils
ASCEND_NPU_ARCH                                        runtime            -
set_dry_run                                            runtime            -
get_dry_run                                            runtime            -
num_sms                                                runtime            -
current_mk_alignment                                   runtime            -
reset_runtime                                          runtime            -
runtime_state                                          runtime            -
restore_runtime                                        runtime            -
"""

#: Each namespace and the file that assembles it.
NAMESPACES = {
    "top": "__init__.py",
    "utils": "utils/__init__.py",
    "utils.math": "utils/math.py",
    "utils.layout": "utils/layout.py",
}
#: Modules whose ``__all__`` lists the table's names of that home.
HOMES_WITH_ALL = {"runtime": "runtime.py"}

BEGIN = "# --- generated from deepgemm_ref._exports.TABLE: do not edit by hand ---"
END = "# --- end of generated block ---"


@dataclass(frozen=True)
class Export:
    """One exported name: ``name`` is ``home``'s ``attr`` (or the module ``home`` itself)."""

    name: str
    home: str
    attr: str | None  # None: the module itself
    namespaces: tuple[str, ...]
    only: str | None = None  # the one target that exports the name (None: as its object says)


def _parse(text: str) -> tuple[Export, ...]:
    out = []
    for line in text.strip().splitlines():
        name, home, *spaces = line.split()
        if home.startswith("="):
            mod, attr = home[1:], None
        else:
            mod, _, attr_ = home.partition(":")
            attr = attr_ or name
        only = next((s.split("=", 1)[1] for s in spaces if s.startswith("only=")), None)
        out.append(Export(name, mod, attr, tuple(s for s in spaces if s != "-" and not s.startswith("only=")), only))
    return tuple(out)


EXPORTS = _parse(TABLE)


def names(namespace: str) -> list[str]:
    """The names of ``namespace`` (``"top"``, ``"utils"``, ...), in table order."""
    return [e.name for e in EXPORTS if namespace in e.namespaces]


def only(namespace: str) -> dict[str, str]:
    """``{name: target}`` of the names of ``namespace`` that only one target exports."""
    return {e.name: e.only for e in EXPORTS if namespace in e.namespaces and e.only is not None}


def defined_in(home: str) -> list[str]:
    """The table's names whose home is ``home`` (its ``__all__``), in table order."""
    return [e.name for e in EXPORTS if e.home == home and e.attr is not None]


def _package_of(namespace: str) -> list[str]:
    """Package path (components below deepgemm_ref) of the module that assembles ``namespace``."""
    file = NAMESPACES[namespace]
    parts = file[:-3].split("/")
    return parts[:-1]


def _relative(package: list[str], module: str) -> tuple[str, str | None]:
    """(``from`` target, imported name) for ``module`` seen from ``package``: ``.x`` / ``..x``."""
    target = module.split(".") if module else []
    ups = len(package)
    common = 0
    while common < min(len(package), len(target)) and package[common] == target[common]:
        common += 1
    dots = "." * (ups - common + 1)
    rest = ".".join(target[common:])
    return dots + rest, None


def _order(name: str) -> tuple[int, str]:
    # isort's order-by-type: CONSTANTS, then Classes, then functions and variables
    if name.isupper() and len(name) > 1:
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name


def _statement(source: str, items: list[str]) -> str:
    items = sorted(set(items), key=_order)
    one = f"from {source} import {', '.join(items)}"
    if len(one) <= 120:
        return one
    return f"from {source} import (\n" + "".join(f"    {i},\n" for i in items) + ")"


def _all_literal(items: list[str]) -> str:
    return "__all__ = [\n" + "".join(f'    "{i}",\n' for i in items) + "]"


def generated_block(namespace: str) -> str:
    """The import statements and ``__all__`` of ``namespace`` (a namespace or a home with ``__all__``)."""
    if namespace in HOMES_WITH_ALL:
        return "\n".join([BEGIN, _all_literal(defined_in(namespace)), END])
    package = _package_of(namespace)
    by_source: dict[str, list[str]] = {}
    for e in EXPORTS:
        if namespace not in e.namespaces:
            continue
        if e.attr is None:  # a module: from <its package> import <it>
            parent, _, leaf = e.home.rpartition(".")
            source, _ = _relative(package, parent)
            by_source.setdefault(source, []).append(leaf if leaf == e.name else f"{leaf} as {e.name}")
        else:
            source, _ = _relative(package, e.home)
            by_source.setdefault(source, []).append(e.attr if e.attr == e.name else f"{e.attr} as {e.name}")
    # isort's order: farther parents first, then by module, then by the first imported name;
    # aliased imports are statements of their own.
    statements: list[tuple[tuple[int, str, str], str]] = []
    for src, items in by_source.items():
        plain = sorted((i for i in items if " as " not in i), key=_order)
        key = (-(len(src) - len(src.lstrip("."))), src.lstrip("."))
        if plain:
            statements.append(((*key, plain[0]), _statement(src, plain)))
        for alias in (i for i in items if " as " in i):
            statements.append(((*key, alias), f"from {src} import {alias}"))
    lines = [BEGIN] + [text for _, text in sorted(statements)]
    lines += ["", _all_literal(names(namespace)), END]
    return "\n".join(lines)


def _files() -> dict[str, Path]:
    root = Path(__file__).resolve().parent
    return {ns: root / f for ns, f in {**NAMESPACES, **HOMES_WITH_ALL}.items()}


def current_block(path: Path) -> str:
    text = path.read_text()
    i, j = text.index(BEGIN), text.index(END)
    return text[i:j + len(END)]


def rewrite(check: bool = False) -> list[str]:
    """Rewrite (or, with ``check``, compare) every generated block; returns the stale files."""
    stale = []
    for ns, path in _files().items():
        want = generated_block(ns)
        if current_block(path) != want:
            stale.append(str(path))
            if not check:
                path.write_text(path.read_text().replace(current_block(path), want))
    return stale


if __name__ == "__main__":  # pragma: no cover - python -m deepgemm_ref._exports [--check]
    left = rewrite(check="--check" in sys.argv)
    print("\n".join(left) or "up to date")
    sys.exit(1 if left and "--check" in sys.argv else 0)
