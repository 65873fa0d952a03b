"""The kernel toolkit: what every kernel family needs between its public signature and the executor.

Four rooms, each imported by its own name (this package itself imports nothing, so the rooms
can sit on different floors: ``sizes`` and ``args`` below :mod:`deepgemm_ref.layout`, the others
above it):

* :mod:`.sizes`: size arguments in the C++ ``int`` range the targets take (``size_arg``), the
  allocation limit and the guards every kernel and utility calls before it copies or allocates
  (``check_alloc`` for derived allocations, ``check_backed`` for broadcast arrays).

* :mod:`.args`: argument coercion (``int_arg``, ``bool_arg``, ``as_array``, ``as_pair``, ...),
  dtype constants, strides and majors, ``ceil_div`` / ``align``.  Every check raises
  :class:`~deepgemm_ref.errors.DGArgumentError` naming the function, the argument, what was
  expected and what came.
* :mod:`.outputs`: the checks of outputs (``check_out``: shape, dtype, row-major, then
  ``check_written``: writeable, not overlapping itself, sharing no memory with any input) and of
  the accumulator input ``c`` (``resolve_c``: ``c is d`` or no shared memory).  Every kernel
  checks its outputs here, before anything is computed or written.
* :mod:`.operands`: A/B operands in every accepted form (FP8, packed FP4, BF16) turned into the
  core's canonical operands, scale factors in every accepted form turned into the scales the
  hardware multiplies by, recipes, and the ``alpha`` / epilogue-object reading.
"""
