"""Diagnose a failing device: which known port bug reproduces what it computed.

``deepgemm-ref diagnose BUNDLE --outputs FILE [--case ID ...] [--json]`` (and
:func:`diagnose`) checks the device's outputs; for every failing case it regenerates the golden
under each applicable entry of the :data:`CATALOGUE` of known port bugs (a mutation of the
inputs, of a layout transform, of the call, or of the output stage; see :mod:`.catalogue` and
:mod:`.mutations`), compares each candidate with the device output element by element, and
ranks the explanations by the share of the failing elements each reproduces, exactly or within
the checker's deterministic bound (:mod:`.engine`).  An explanation *explains* the case when it
reproduces at least :data:`THRESHOLD` (90%) of the failing elements within the bound while
keeping the passing ones within its own bound; when none does the verdict is "no known bug
explains it" and the closest candidates are listed as such.

Mutations that do not touch the GEMM (``c``, ``alpha``, the output rounding, a transposed store,
unwritten tiles, a UE8M0 exponent off by one) reuse the stored accumulator; large dense GEMMs
are screened on a sample of rows and column blocks and the best candidates confirmed on the
whole case.
"""

from __future__ import annotations

from .catalogue import CATALOGUE, Entry, applicable, entry
from .engine import THRESHOLD, CaseContext
from .report import diagnoses_json, format_diagnoses
from .run import CaseDiagnosis, Explanation, diagnose, diagnose_case, diagnose_outputs

__all__ = ["diagnose", "diagnose_outputs", "diagnose_case", "CaseDiagnosis", "Explanation", "CATALOGUE", "Entry",
           "entry", "applicable", "THRESHOLD", "CaseContext", "format_diagnoses", "diagnoses_json"]
