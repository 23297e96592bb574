"""The attention problems a measurement runs on: :class:`~zyfa.accuracy.inputs.attention_input.AttentionInput`,
seeded Gaussian draws and captured model activations (``attention_input``), controlled synthetic inputs
(``synthetic``), the torch-free descriptions a command checks before any heavy import (``gaussian_spec``,
``synthetic_spec``), and per-input features that explain error (``features``). Imports ``accuracy.io`` only."""
