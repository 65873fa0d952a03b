"""The catalogue's DeepEP entries: what each known port bug of dispatch and combine does to a case.

Each candidate is the case's goldens recomputed from its inputs by the pure model
(:func:`..ep.ep_goldens`) with the bug switched on (a ``variant``), seen through the family's check
view (canonical order, payloads as bit patterns) and compared on the elements the case checks.
Combine candidates whose bug keeps DeepEP's data flow (other rows, biases or partial roundings)
carry their own exact sum and bound, so a device with the bug that also sums in another order is
still reproduced within the bound; the others (another order, a bf16 bias addition) are compared
bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..ep import OWNER_MAPS, EPConfig, ep_goldens, ep_view
from .engine import Candidate, CaseContext, Sample, Variant

__all__ = ["ep_combine_order", "ep_partial_not_rounded", "ep_bias_misapplied", "ep_weights_misapplied",
           "ep_expert_wrong_rank", "ep_padding_not_zeroed", "ep_sf_not_copied", "ep_sf_int16_misread"]


def _cfg(ctx: CaseContext) -> EPConfig | None:
    return EPConfig.of_entry(ctx.entry) if ctx.family.name in ("ep_dispatch", "ep_combine") else None


def _variant(ctx: CaseContext, params: dict[str, Any], change: dict[str, Any]) -> Variant:
    """The case's goldens with ``change`` switched on, as candidates for every output."""
    cfg = EPConfig.of_entry(ctx.entry)
    cache: dict[str, dict[str, Candidate]] = {}

    def compute(_sample: Sample | None) -> dict[str, Candidate]:
        if "full" not in cache:
            golden = ep_goldens(cfg, ctx.inputs, change)
            view = ep_view(ctx.entry, golden, None)
            out = {}
            for name in ctx.outputs_desc:
                g = dict(view.goldens[name])
                g["defined"] = ctx.output_goldens[name]["defined"]  # the elements the case checks
                out[name] = Candidate(g, ctx.check_of(name), ctx.inputs)
            cache["full"] = out
        return cache["full"]

    return Variant(params, compute, "regen")


def ep_combine_order(ctx: CaseContext) -> Iterator[Variant]:
    """Another float32 order than DeepEP's: the owners' partials in ascending rank instead of
    ascending master slot (``order: rank``), the terms in descending order (``reverse``), or the
    biases after the terms (``bias_last``); compared bit for bit (the bound accepts any order)."""
    cfg = _cfg(ctx)
    if cfg is None or not cfg.combine:
        return
    forms = (["rank"] if cfg.recipe == "local" and cfg.ranks > 1 else []) + ["reverse"]
    if cfg.bias:
        forms.append("bias_last")
    for form in forms:
        yield _variant(ctx, {"order": form}, {"order": form})


def ep_partial_not_rounded(ctx: CaseContext) -> Iterator[Variant]:
    """An owner rank's partial of two or more slots added to the final sum in float32, without
    the bf16 rounding DeepEP applies where the partial is sent."""
    cfg = _cfg(ctx)
    if cfg is None or not cfg.combine or cfg.recipe != "local":
        return
    yield _variant(ctx, {"partial": "float32"}, {"rounding": "missing"})


def ep_bias_misapplied(ctx: CaseContext) -> Iterator[Variant]:
    """The bias added twice, or added in bf16: to the bf16-rounded sum of the terms, each
    addition rounded to bf16, instead of first into the float32 sum."""
    cfg = _cfg(ctx)
    if cfg is None or not cfg.combine or not cfg.bias:
        return
    yield _variant(ctx, {"bias": "added twice"}, {"bias": "twice"})
    yield _variant(ctx, {"bias": "added in bf16"}, {"bias": "bf16"})


def ep_weights_misapplied(ctx: CaseContext) -> Iterator[Variant]:
    """The top-k weights applied twice (the combine multiplies the rows it is given, which the
    expert side has already weighted, by their weights again: expanded every slot row, non-expanded
    each owner's row by its master slot's weight), or not applied (the dispatch loses them: the
    rows enter the combine unweighted and no weights come back)."""
    cfg = _cfg(ctx)
    if cfg is None or not cfg.combine or not cfg.weights:
        return
    if cfg.combine_weights:
        yield _variant(ctx, {"weights": "applied twice"}, {"weights": "applied_twice"})
    yield _variant(ctx, {"weights": "not applied"}, {"weights": "not_applied"})


def ep_expert_wrong_rank(ctx: CaseContext) -> Iterator[Variant]:
    """An expert's tokens sent to the wrong rank: owners assigned round robin (``e % R``, local
    index ``e // R``) instead of in blocks (``e // E_l``), or every expert one rank up."""
    cfg = _cfg(ctx)
    if cfg is None or cfg.ranks < 2:
        return
    for name in OWNER_MAPS:
        if name == "round_robin" and cfg.e_l == 1:
            continue  # the same map
        yield _variant(ctx, {"owner": name}, {"owner": name})


def ep_padding_not_zeroed(ctx: CaseContext) -> Iterator[Variant]:
    """Expanded padding rows (``do_zero_padding``) not zeroed: holding a copy of the expert's
    last slot row (``previous_row``), or of the next expert's first row (``next_row``)."""
    cfg = _cfg(ctx)
    if cfg is None or cfg.combine or not (cfg.expand and cfg.zero_padding and cfg.alignment > 1):
        return
    for form in ("previous_row", "next_row"):
        yield _variant(ctx, {"padding": form}, {"padding": form})


def ep_sf_not_copied(ctx: CaseContext) -> Iterator[Variant]:
    """FP8 scale factors not copied with their rows: the j-th token received from a rank given
    that rank's j-th SF row (``by_position``), its first token's (``first_token``), or none
    written (``not_written``: zero)."""
    cfg = _cfg(ctx)
    if cfg is None or cfg.combine or not cfg.fp8:
        return
    for form in ("by_position", "first_token", "not_written"):
        yield _variant(ctx, {"sf": form}, {"sf": form})


def ep_sf_int16_misread(ctx: CaseContext) -> Iterator[Variant]:
    """DeepEP-Ascend's int16 view of the float32 scale factors misread: the two int16 halves of
    each 4-byte pack swapped (``halves_swapped``), or the two bytes of each int16
    (``bytes_swapped``)."""
    cfg = _cfg(ctx)
    if cfg is None or cfg.combine or not cfg.fp8 or not cfg.ascend:
        return
    for form in ("halves_swapped", "bytes_swapped"):
        yield _variant(ctx, {"int16": form}, {"int16": form})
