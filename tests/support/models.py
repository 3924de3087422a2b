"""Random-weight checkpoints generated at test time (no model hub is reachable).

The generators live in the package (``sgl_ridgefill.tools.synthetic``), where ``sgl-ridgefill soak --tiny``
uses them too; this module keeps the names the tests import.
"""

from __future__ import annotations

from sgl_ridgefill.tools.synthetic import TINY_FAMILIES as FAMILIES
from sgl_ridgefill.tools.synthetic import TINY_HYBRID_ATTENTION_EVERY as HYBRID_ATTENTION_EVERY
from sgl_ridgefill.tools.synthetic import TINY_HYBRID_FAMILIES as HYBRID_FAMILIES
from sgl_ridgefill.tools.synthetic import TINY_VOCAB_SIZE as VOCAB_SIZE
from sgl_ridgefill.tools.synthetic import make_tiny_checkpoint, make_tokenizer

__all__ = ["FAMILIES", "HYBRID_ATTENTION_EVERY", "HYBRID_FAMILIES", "VOCAB_SIZE", "make_tiny_checkpoint", "make_tokenizer"]
