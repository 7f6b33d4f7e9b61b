"""The rule catalog (installed as `matlint.rules`): one module per rule, plus shared analyses
in the modules whose names start with `_`."""
