"""Evaluation of RidgeFill's approximation error: needle retrieval, token loss, decoding agreement, splice tests."""
