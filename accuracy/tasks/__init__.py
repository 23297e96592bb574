"""Tasks scored on a model's generated output with any attention implementation in every step: HumanEval pass@1
(``zyfa tasks humaneval``), its sandbox, and the paired statistics of the comparison against a baseline."""
