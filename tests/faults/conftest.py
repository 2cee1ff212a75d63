"""The fault suite's fixtures (defined in fault_support.py, with the helpers its tests import)."""

from fault_support import fw, world  # noqa: F401
