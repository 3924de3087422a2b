"""RidgeFill's attention contract and its implementations on SGLang's attention backends.

A RidgeFill sub-pass asks attention for *row queries*: arbitrary sorted positions of one request, each
attending causally by position to the request's visible keys. ``planner.py`` (engine-free) turns such a
sub-pass into *virtual extend requests* that stock kernels can run; one module per engine backend
(``cpu``, ``triton``, ``flashinfer``, ``fa3``) expresses the plan in that backend's metadata.
"""
