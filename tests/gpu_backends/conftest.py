"""The engine tests' fixtures (tiny random checkpoints with maps folders) for the GPU-backend tests."""

from tests.engine.conftest import tiny_models  # noqa: F401  (a fixture, found by pytest here)
