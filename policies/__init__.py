"""Shipped ``.rfpolicy`` files (imported as ``sgl_ridgefill.policies``)."""
