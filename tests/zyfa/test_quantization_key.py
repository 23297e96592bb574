"""``zyfa.emulator.QUANT_FIELDS``: exactly the recipe fields ``quantize_inputs`` reads, so a shared FP64 reference
(accuracy.operator.runner, accuracy.cliffs.sweep) is shared only by recipes that see the same dequantized inputs."""

from __future__ import annotations

import ast
import inspect
import textwrap

import torch

from zyfa.emulator import QUANT_FIELDS, quantization_key, quantize_inputs
from zyfa.recipe_spec import get_recipe


def _recipe_attributes(fn) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "recipe"}


def test_fields_are_what_quantize_inputs_reads():
    assert set(QUANT_FIELDS) == _recipe_attributes(quantize_inputs)
    assert len(QUANT_FIELDS) == len(set(QUANT_FIELDS))


def test_rotation_fields_split_the_key_and_the_dequantized_inputs():
    base = get_recipe("zyfa")
    rot = base.replace(qk_rotation="hadamard", rotation_seed=0)
    assert quantization_key(base) != quantization_key(rot)
    assert quantization_key(rot) != quantization_key(rot.replace(rotation_seed=1))
    assert quantization_key(base) == quantization_key(base.replace(rotation_seed=5))  # no rotation: seed unread
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=g) for _ in range(3))
    a, b = quantize_inputs(q, k, v, base).dequantized(), quantize_inputs(q, k, v, rot).dequantized()
    assert not torch.equal(a[0], b[0])  # one key would have shared a wrong reference
    c = quantize_inputs(q, k, v, base.replace(rotation_seed=5)).dequantized()
    assert all(torch.equal(x, y) for x, y in zip(a, c, strict=True))
