"""The roof (SPEC §1): the ``tasuki`` command, the demo, ``up`` and the viewer's printing.

It may import every package; none imports it.
"""
