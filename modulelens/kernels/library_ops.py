"""Library operators a module candidate may keep: partial fusion.

A module candidate may call named library operators -- matrix products, convolutions, attention --
and compute the rest itself (bias adds, activations, norms, residuals fused into its own loops).
It declares them in a header line of its source::

    # modulelens-library-ops: aten.addmm, aten.bmm

Validation then denies every other computing operator (and numpy) in its denial run: correct there,
it computed everything but the declared operators itself, and its verdict is ``custom``, naming the
operators kept and what it computes itself. Only operators of :data:`KEEPABLE` may be kept (an
activation or a norm is the work a candidate is judged on); a declared name outside it is reported
and not kept. An undeclared library call, or a candidate of a module whose eager computation is
only declared library operators (it computes nothing itself), stays a ``wrapper``.

Names are written ``aten.NAME`` (or ``aten::NAME``); every overload of ``NAME`` is kept.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

HEADER = "modulelens-library-ops:"
_LINE = re.compile(r"^\s*#\s*modulelens-library-ops:(.*)$", re.MULTILINE)

# Base names of the aten operators a candidate may keep: matrix products, convolutions, attention.
KEEPABLE = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "addbmm", "_addmm_activation",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "mkldnn_convolution", "_mkldnn_convolution", "cudnn_convolution",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
    "_fused_sdp_choice",
})


class LibraryOps(BaseModel):
    """What a candidate's header declares: the operators it keeps (``aten::NAME``) and the names it
    declared that may not be kept (with why)."""

    kept: list[str] = Field(default_factory=list, description="aten::NAME of each keepable operator declared.")
    refused: list[str] = Field(default_factory=list, description="Declared names that are not kept, each with why.")

    def keeps(self, op: str) -> bool:
        """Whether the recorded operator ``op`` (``aten::NAME`` or ``aten::NAME.overload``) is kept."""
        return op.split(".", 1)[0] in self.kept

    @property
    def bases(self) -> list[str]:
        """The kept operators' base names (``addmm``), as the denial process takes them."""
        return [k.split("::", 1)[1] for k in self.kept]


def declared_library_ops(source: str) -> LibraryOps:
    """The library operators ``source`` declares it keeps (every ``# modulelens-library-ops:``
    line, names separated by commas or spaces); no header: none."""
    kept: list[str] = []
    refused: list[str] = []
    for line in _LINE.findall(source):
        for name in re.split(r"[,\s]+", line.strip()):
            if not name:
                continue
            ns, sep, base = name.replace("::", ".").partition(".")
            base = base.split(".", 1)[0]
            if not sep or ns != "aten" or not base:
                refused.append(f"{name} (write aten.NAME, e.g. aten.addmm)")
            elif base not in KEEPABLE:
                refused.append(f"{name} (not a matrix product, convolution or attention: computing it is the "
                               "candidate's own work)")
            elif f"aten::{base}" not in kept:
                kept.append(f"aten::{base}")
    return LibraryOps(kept=kept, refused=refused)
