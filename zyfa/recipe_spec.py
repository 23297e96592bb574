"""Recipe specs: the one grammar every command takes to name a recipe (docs/CONTRACTS.md "Recipe specs").

``[NAMESPACE:]NAME[:FIELD=VALUE,...][@PLATFORM]``, parsed by :func:`get_recipe` / :func:`split_spec`. A namespace
(:data:`NAMESPACES`: ``triton``, ``cute``) is matched first: the recipe as our Triton or CuTe kernel computes it (both
the same kernel version of a recipe, :data:`TRITON_KERNEL_FIELDS`). After it ``:`` only introduces overrides, each
value parsed by its field's type (``head_dim_tiles`` as ``D:MxN|...``); ``@`` names the platform. The recipe is
named by its canonical spec (named recipes keep their names). :func:`split_spec_list` splits a list of specs; a bad
spec raises :class:`SpecError` in one line. The recipes and their fields are :mod:`zyfa.recipes`; this module only
reads and writes their names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zyfa.platforms import PLATFORM_NAMES
from zyfa.recipes import ACCUMULATOR_ALIASES, DESCRIPTIVE_FIELDS, RECIPES, Recipe

# Namespace prefixes, a fixed set matched before anything else: NAMESPACE ':' RECIPE-SPEC. Each names one of our
# kernels (zyfa.kernels.attention_fp8's Triton kernel, zyfa.kernels.attention_cute's CuTe DSL kernel); which recipes
# each honours is its plan's business (zyfa.kernels.kernel_plan, zyfa.kernels.cute_plan), not the grammar's.
NAMESPACES = ("triton", "cute")
# What our Triton kernel (zyfa.kernels.attention_fp8) computes of a recipe, where it differs from the recipe: FA3's
# head-dim tiles (224 keys at hd128, 160 at hd64 and hd192) are no Triton block size, so the kernel keeps the
# recipe's block_m x block_n, and it visits KV tiles from key 0 on. The CuTe kernel computes the same version (its
# plan takes forward KV order and 128-key tiles only, and it never reads head_dim_tiles).
TRITON_KERNEL_FIELDS = {"head_dim_tiles": (), "kv_order": "forward"}
# Fields an override may not set: they describe a recipe (its name is its spec).
_NOT_OVERRIDABLE = DESCRIPTIVE_FIELDS


class SpecError(ValueError):
    """A recipe spec that does not parse or names no recipe; its message is one line."""


@dataclass(frozen=True)
class SpecParts:
    """A recipe spec split by the grammar: ``[NAMESPACE:]NAME[:FIELD=VALUE,...][@PLATFORM]``.

    ``overrides`` keeps the order given, each value parsed by its Recipe field's type."""

    namespace: str | None
    name: str
    overrides: tuple[tuple[str, object], ...]
    platform: str | None

    def text(self) -> str:
        """The canonical spec: ``[NAMESPACE:]NAME[:f=v,...][@PLATFORM]``, the platform as given."""
        return (f"{self.namespace}:" if self.namespace else "") + self.recipe_spec() \
            + (f"@{self.platform}" if self.platform else "")

    def recipe_spec(self) -> str:
        """The canonical text of the recipe part (no namespace, no platform): ``NAME[:f=v,...]``."""
        if not self.overrides:
            return self.name
        return self.name + ":" + ",".join(f"{k}={format_field_value(k, v)}" for k, v in self.overrides)


def overridable_fields() -> list[str]:
    """The Recipe fields an override may set, in declaration order."""
    return [f.name for f in dataclasses.fields(Recipe) if f.name not in _NOT_OVERRIDABLE]


_FIELD_TYPES = {f.name: str(f.type) for f in dataclasses.fields(Recipe)}


def format_field_value(field_name: str, value) -> str:
    """An override value as the grammar writes it (``head_dim_tiles`` as ``D:MxN|...``, bools as true/false)."""
    if field_name == "head_dim_tiles":
        return "|".join(f"{d}:{m}x{n}" for d, m, n in value) or "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse_head_dim_tiles(val: str) -> tuple[tuple[int, int, int], ...]:
    """``"64:192x128|128:128x192"`` -> ((64, 192, 128), (128, 128, 192)); ``"none"`` -> ()."""
    if val.lower() == "none":
        return ()
    out = []
    for entry in val.split("|"):
        d, colon, mn = entry.partition(":")
        m, x, n = mn.partition("x")
        try:
            if not (colon and x):
                raise ValueError
            out.append((int(d), int(m), int(n)))
        except ValueError:
            raise ValueError(f"entry {entry!r} is not D:MxN (max head dim, block_m, block_n; entries joined by "
                             "'|', e.g. 64:192x128|128:128x192, or none)") from None
    return tuple(out)


def parse_field_value(field_name: str, text: str):
    """``text`` parsed by the type of Recipe field ``field_name``; ValueError (one line) for a bad value."""
    kind = _FIELD_TYPES[field_name]
    if field_name == "head_dim_tiles":
        return _parse_head_dim_tiles(text)
    if kind == "bool":
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"takes true or false (or 1, 0), not {text!r}")
        return text.lower() in ("true", "1")
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"takes an integer, not {text!r}") from None
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"takes a number, not {text!r}") from None
    if not text:
        raise ValueError("takes a non-empty value")
    if field_name == "accumulator":
        return ACCUMULATOR_ALIASES.get(text, text)  # an old name is read and written as today's
    return text


def names_old_accumulator(text: str) -> bool:
    """Whether ``text`` (a stored spec, e.g. a result row's ``recipe``) spells an accumulator by an old name
    (``accumulator=hopper_fp8``, :data:`zyfa.recipes.ACCUMULATOR_ALIASES`). The grammar still reads such a spec typed
    by a user; result files are migrated once (``scripts/migrate_rows.py``) and their readers refuse the old name."""
    return any(f"accumulator={old}" in text for old in ACCUMULATOR_ALIASES)


def split_spec(spec: str) -> SpecParts:
    """Split a recipe spec by the grammar (module docstring), checking the name, platform, fields and values;
    :class:`SpecError` in one line for anything else. ``NAME@PLATFORM:overrides`` is read as
    ``NAME:overrides@PLATFORM``."""
    if not isinstance(spec, str):
        raise SpecError(f"unknown recipe {spec!r}: a recipe spec is a string")
    text = spec.strip()
    namespace = None
    head, colon, tail = text.partition(":")
    if colon and head in NAMESPACES:
        namespace, text = head, tail
    stop = min((i for i in (text.find(":"), text.find("@")) if i >= 0), default=len(text))
    name, rest = text[:stop].strip(), text[stop:]
    if name not in RECIPES:
        raise SpecError(f"unknown recipe {name!r}; known recipes: {', '.join(RECIPES)} (a spec is "
                        f"[{'|'.join(NAMESPACES)}:]NAME[:field=value,...][@PLATFORM])")
    platform = None
    if rest.count("@") > 1:
        raise SpecError(f"recipe spec {spec!r} names more than one platform (one '@PLATFORM' at most)")
    if rest.startswith("@"):
        platform, _, over = rest[1:].partition(":")
    else:
        over = rest[1:]
        if "@" in over:
            over, _, platform = over.rpartition("@")
    if platform is not None:
        platform = platform.strip()
        if platform not in PLATFORM_NAMES:
            raise SpecError(f"unknown platform {platform!r}; known platforms: {', '.join(PLATFORM_NAMES)}")
    overrides: list[tuple[str, object]] = []
    fields = overridable_fields()
    for item in over.split(",") if over.strip() else ():
        key, eq, val = item.partition("=")
        key, val = key.strip(), val.strip()
        if not eq or key not in fields:
            why = "not field=value" if not eq else (f"{key!r} may not be overridden" if key in _FIELD_TYPES
                                                    else f"no field {key!r}")
            raise SpecError(f"bad recipe override {item.strip()!r} in {spec!r}: {why}; fields: {', '.join(fields)}")
        if any(k == key for k, _ in overrides):
            raise SpecError(f"bad recipe override {item.strip()!r} in {spec!r}: {key} is set twice")
        try:
            overrides.append((key, parse_field_value(key, val)))
        except ValueError as e:
            raise SpecError(f"bad recipe override {item.strip()!r} in {spec!r}: {key} {e}; "
                            f"fields: {', '.join(fields)}") from None
    return SpecParts(namespace, name, tuple(overrides), platform)


def triton_kernel_recipe(r: Recipe, namespace: str = "triton") -> Recipe:
    """``r`` as our kernels compute it (:data:`TRITON_KERNEL_FIELDS`): itself where nothing differs, else a copy
    named ``<namespace>:<name>`` (``triton:fa3``, ``cute:fa3``)."""
    changes = {k: v for k, v in TRITON_KERNEL_FIELDS.items() if getattr(r, k) != v}
    return r.replace(name=f"{namespace}:{r.name}", **changes) if changes else r


def get_recipe(spec: str | Recipe) -> Recipe:
    """The recipe a spec names (the grammar of the module docstring); a :class:`Recipe` passes through.

    The result is named by its canonical spec: ``[NAMESPACE:]NAME[:field=value,...][@PLATFORM]``, the namespace only
    where the kernel's recipe differs, the platform only where it is not the recipe's own (so ``zyfa@mi355x`` is
    ``zyfa``). :class:`SpecError` (a ValueError), one line, for an unknown name, field, value or platform, or a
    combination the Recipe refuses."""
    if isinstance(spec, Recipe):
        return spec
    parts = split_spec(spec)
    r = RECIPES[parts.name]
    if parts.overrides:
        try:
            r = r.replace(name=parts.recipe_spec(), **dict(parts.overrides))
        except ValueError as e:
            raise SpecError(str(e)) from None
    if parts.namespace is not None:
        r = triton_kernel_recipe(r, parts.namespace)
    if parts.platform is not None:
        r = r.on(parts.platform)
    return r


def split_spec_list(text: str) -> list[str]:
    """A list of specs -> the specs: split on ';' where there is one, else on ',' with each ``field=value`` piece
    (no ':' before its '=') kept with the spec before it (``zyfa:accumulator=matrix_unit,accum_flush_tiles=1,ck``
    is two specs). Empty items are dropped."""
    if ";" in text:
        return [s.strip() for s in text.split(";") if s.strip()]
    out: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if out and "=" in piece and ":" not in piece.split("=", 1)[0] and "@" not in piece.split("=", 1)[0]:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def parse_recipes(spec: str) -> list[Recipe]:
    """A list of recipe specs (:func:`split_spec_list`; ``all`` alone for every named recipe) -> recipes."""
    names = split_spec_list(spec)
    if not names:
        raise SpecError("no recipe given")
    if names == ["all"]:
        return list(RECIPES.values())
    return [get_recipe(n) for n in names]
