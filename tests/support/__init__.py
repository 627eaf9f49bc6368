"""Helpers every test area shares: import them from here (``from support import ...``).

- ``support.checkers``: permission checkers for tests that need no compiled tables.
- ``support.env``: the build cache and the environment a test's subprocess gets.
- ``support.bundle``: building the demo bundle once per session.
"""
