"""The rule catalog (installed as `matlint.rules`): one module per rule, or one package per rule
with a runtime check or over ~600 lines (the rule class in its `__init__.py`, its runtime half in
`runtime.py`, which only the guard imports); shared analyses in the modules whose names start
with `_`."""
