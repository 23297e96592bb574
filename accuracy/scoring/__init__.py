"""How rows are judged, with no run in it: the error metrics and their names, the bands a real kernel keeps
against its emulation, verdicts from paired units with their power, study plans (the rule decided before the
data), one verdict per implementation from its rows, and one-factor ablations paired per input. Imports nothing
else of ``accuracy``."""
